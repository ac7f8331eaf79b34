"""The write side of the store: ``append`` puts messages at the end of one queue (commitlog
records, then index entries), waits for the fsync when the flush mode asks for it, and tells
the arrival listeners. A disk that refuses the write refuses the send, never silently."""

from __future__ import annotations

import contextlib
import itertools
import logging
import uuid
from collections.abc import Callable
from pathlib import Path

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message, StoredMessage
from popmq.broker.store.codec import encode_record_head, tag_hash
from popmq.broker.store.commitlog import CommitLog
from popmq.broker.store.durability import Checkpointer
from popmq.broker.store.framing import FRAME_HEADER, Frame, frame_header
from popmq.broker.store.group_commit import GroupCommit
from popmq.broker.store.queue_index import ENTRY, QueueIndex

from popmq.clock import Clock

log = logging.getLogger(__name__)
_WRITE_FAILURE_LOG_EVERY_S = 10.0
_pack_entry = ENTRY.pack
FRAME_HEADER_SIZE = FRAME_HEADER.size
# A body this large is written from where it is (for a large send, a view of grpc's bytes of
# the request) rather than joined with its record's head: one copy less of it while it is
# stored. Smaller ones are joined: one write buffer per frame costs less than two.
WRITE_IN_PLACE_FROM = 64 * 1024

ArrivalListener = Callable[[str, int, int, set[str]], None]


class MessageIds:
    """Ids for messages that arrive without one: a random per-process prefix and a counter.
    (uuid4 per message costs more than the rest of an append.)"""

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:16].upper()
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):016X}"


class QueueWriter:
    def __init__(
        self,
        data_dir: Path,
        broker_name: str,
        commitlog: CommitLog,
        group: GroupCommit,
        checkpointer: Checkpointer,
        *,
        sync: bool,
        clock: Callable[[], int],
        timer: Clock,
    ) -> None:
        self._dir = data_dir
        self._broker_name = broker_name
        self._host_bytes = broker_name.encode()
        self._commitlog = commitlog
        self._group = group
        self._checkpointer = checkpointer  # while its flush fails, appends wait for their fsync
        self._sync = sync
        self._clock = clock
        self._timer = timer
        self._listeners: list[ArrivalListener] = []
        self._tag_hashes: dict[str, int] = {}
        self._ids = MessageIds()
        self.last_store_ts = 0  # store times never go back (offset_for_timestamp bisects them)
        self.write_failures = 0  # appends refused because the disk failed (full, read-only)
        self._write_failure_logged = -_WRITE_FAILURE_LOG_EVERY_S

    async def append(
        self,
        topic: str,
        topic_bytes: bytes,
        queue_id: int,
        index: QueueIndex,
        messages: list[Message],
    ) -> list[StoredMessage]:
        """Store messages at the end of one queue, in order. See message_store.py for when
        this returns relative to the fsync."""
        if not messages:
            return []
        ids, base, now = await self._write(topic, topic_bytes, queue_id, index, messages)
        return [
            StoredMessage(
                topic=topic,
                queue_id=queue_id,
                queue_offset=base + i,
                body=message.body,
                tag=message.tag,
                keys=list(message.keys),
                properties=dict(message.properties),
                message_id=ids[i],
                message_group=message.message_group,
                delivery_timestamp_ms=message.delivery_timestamp_ms,
                born_timestamp_ms=message.born_timestamp_ms,
                born_host=message.born_host,
                store_timestamp_ms=now,
                store_host=self._broker_name,
                reconsume_times=message.reconsume_times,
            )
            for i, message in enumerate(messages)
        ]

    async def append_ids(
        self,
        topic: str,
        topic_bytes: bytes,
        queue_id: int,
        index: QueueIndex,
        messages: list[Message],
    ) -> tuple[list[str], int]:
        """``append`` for a caller that needs only each message's id and the first one's
        queue offset (a producer's send): no stored copy of every message is built."""
        if not messages:
            return [], index.max_offset
        ids, base, _ = await self._write(topic, topic_bytes, queue_id, index, messages)
        return ids, base

    async def _write(
        self,
        topic: str,
        topic_bytes: bytes,
        queue_id: int,
        index: QueueIndex,
        messages: list[Message],
    ) -> tuple[list[str], int, int]:
        """Write (and, as configured, wait durable) ``messages``: their ids, the first one's
        queue offset and the store time."""
        now = self._clock()
        if now < self.last_store_ts:  # keep store times ordered for offset_for_timestamp
            now = self.last_store_ts
        self.last_store_ts = now
        base = index.max_offset
        host = self._host_bytes
        hashes = self._tag_hashes
        frames: list[Frame] = []
        lengths: list[int] = []  # each frame's, counted once (the index entries need them)
        ids: list[str] = []
        for i, message in enumerate(messages):
            message_id = message.message_id or self._ids.next()
            ids.append(message_id)
            head = encode_record_head(message, topic_bytes, queue_id, base + i, now, host,
                                      message_id)  # fmt: skip
            body = message.body
            lengths.append(FRAME_HEADER_SIZE + len(head) + len(body))
            if len(body) >= WRITE_IN_PLACE_FROM:
                frames.append((frame_header(head, body) + head, body))
            else:
                frames.append((b"".join((frame_header(head, body), head, body)),))
        try:
            positions = self._commitlog.append(frames)
            entries = []
            for message, position, length in zip(messages, positions, lengths, strict=True):
                code = hashes.get(message.tag)
                if code is None:
                    if len(hashes) > 4096:
                        hashes.clear()
                    code = hashes[message.tag] = tag_hash(message.tag)
                entries.append(_pack_entry(position, length, code, now))
            index.append(b"".join(entries))
        except OSError as exc:
            self._count_write_failure(exc)
            raise RefusedError(
                Code.MASTER_PERSISTENCE_TIMEOUT,
                f"store write failed, the message was not stored: {exc}",
            ) from exc
        if self._sync or self._checkpointer.flush_failing:
            await self._wait_durable(positions[-1] + lengths[-1])
        self._notify(topic, queue_id, base + len(messages), {m.tag for m in messages})
        return ids, base, now

    async def _wait_durable(self, position: int) -> None:
        """Group-commit fsync up to ``position``; a failure refuses the send (never an
        acknowledgement of data the disk did not take)."""
        try:
            await self._group.wait_durable(position)
        except RefusedError as exc:
            raise RefusedError(
                Code.MASTER_PERSISTENCE_TIMEOUT, f"the message could not be made durable: {exc}"
            ) from exc

    def add_arrival_listener(self, callback: ArrivalListener) -> None:
        self._listeners.append(callback)

    def remove_arrival_listener(self, callback: ArrivalListener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(callback)

    def _notify(self, topic: str, queue_id: int, max_offset: int, tags: set[str]) -> None:
        for listener in self._listeners:
            try:
                listener(topic, queue_id, max_offset, tags)
            except Exception:
                log.exception("store: arrival listener %r failed", listener)

    def _count_write_failure(self, exc: OSError) -> None:
        """A refused append: counted, and logged at most every few seconds (a full disk
        refuses every send: one line per send would flood the log)."""
        self.write_failures += 1
        now = self._timer.monotonic()
        if now - self._write_failure_logged >= _WRITE_FAILURE_LOG_EVERY_S:
            self._write_failure_logged = now
            log.error("store: cannot write to %s (%s): sends are refused (%d so far); free "
                      "space on the volume or fix it",
                      self._dir, exc, self.write_failures)  # fmt: skip
