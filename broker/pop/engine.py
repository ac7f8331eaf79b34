"""The POP engine: pop, ack, change_invisible_time, notify and forward_to_dlq.

Flow of a pop (RocketMQ's PopMessageProcessor): about one pop in five reads the group's retry
topic first; then the requested queue, or every queue starting at a random one; a pop that is
not full then reads the retry topic. Each queue is read under a non-blocking lock (a busy queue
is skipped) from the group's cursor, skipping offsets in flight or already done; what is read
becomes one checkpoint (invisible until ``now + invisible_time``) and each message gets a
signed receipt handle. FIFO pops skip a queue while it has messages in flight and never read
the retry topic. An empty pop with ``poll_time_ms > 0`` waits in the hold table.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import anyio
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import (
    PROP_ORIGIN_TOPIC,
    AckEntry,
    AckEntryResult,
    ChangeInvisibleResult,
    NotifyRequest,
    NotifyResult,
    PoppedMessage,
    PopRequest,
    PopResult,
    PopStatus,
    StoredMessage,
    legacy_retry_topic,
    retry_topic,
)
from popmq.broker.pop.checkpoint import Checkpoint, EntryState
from popmq.broker.pop.gone import GONE_REASON, log_gone
from popmq.broker.pop.groups import GroupRegistry
from popmq.broker.pop.handle import HandleCodec, ReceiptHandle, group_hash
from popmq.broker.pop.handle_keys import HandleKeyring
from popmq.broker.pop.hold import HoldKey, HoldOutcome, HoldTable
from popmq.broker.pop.journal import PopJournal
from popmq.broker.pop.ledger import CheckpointLedger
from popmq.broker.pop.names import check_group, check_topic
from popmq.broker.pop.selection import QueueLocks, pop_queue_order

from popmq.clock import SYSTEM, Clock
from popmq.config import BrokerConfig

if TYPE_CHECKING:
    from popmq.broker.store.message_store import MessageStore

# How far notify scans past in-flight messages looking for a visible one, per queue (in
# index reads of 32 entries).
_NOTIFY_SCAN_READS = 4
# A SQL92 visibility check decodes messages: at most this many reads of this many each.
_SQL_SCAN_READS = 8
_SQL_SCAN_BATCH = 128
# A SQL92 pop decodes every message it passes over: one pass over the queues passes over at
# most this many, in reads of _SQL_SCAN_BATCH, then the pop lets the loop run before it goes
# on (a filter that matches nothing in a long backlog would otherwise hold the broker).
_SQL_POP_SCAN = 1024

# A held pop with less than this much of its poll time left, or than _ENDING_SHARE of it,
# is about to end: woken, it pops at once, with no fill window (as the proxy's notify
# receive about to end: proxy.longpoll.hub.ENDING_S / ENDING_SHARE).
_ENDING_MS = 1000
_ENDING_SHARE = 0.2


@dataclass(slots=True)
class _ScanBudget:
    left: int = _SQL_POP_SCAN
    cut: bool = False  # the pass stopped on the budget, not at the end of the queues


class PopEngine:
    def __init__(
        self,
        *,
        name: str,
        config: BrokerConfig,
        store: MessageStore,
        ledger: CheckpointLedger,
        journal: PopJournal,
        hold: HoldTable,
        groups: GroupRegistry,
        clock: Callable[[], int],
        rng: random.Random | None = None,
        keyring: HandleKeyring | None = None,
        time: Clock = SYSTEM,
    ) -> None:
        self._name = name
        self._config = config
        self._store = store
        self._ledger = ledger
        self._journal = journal
        self._hold = hold
        self._groups = groups
        self._clock = clock
        self._rng = rng or random.Random()
        # This broker's own handle keys (made in its data dir on first start).
        self._codec = HandleCodec(keyring or HandleKeyring.open(config, time))
        self.keyring = self._codec.keyring
        self.locks = QueueLocks()

    @property
    def gone_inflight(self) -> int:
        """Entries finished because their message was no longer in the store when they came
        due (popmq_broker_inflight_gone_messages_total)."""
        return self._ledger.gone

    # -- validation -----------------------------------------------------------------------
    def _queue_count(self, topic: str) -> int:
        meta = self._store.get_topic(topic)
        if meta is None:
            raise RefusedError(Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        return meta.queue_count

    def _check_queue(self, queue_id: int, count: int, topic: str) -> None:
        if queue_id != -1 and not 0 <= queue_id < count:
            raise RefusedError(
                Code.BAD_REQUEST, f"queue {queue_id} is not a queue of {topic!r} (0..{count - 1})"
            )

    def _check_invisible(self, invisible_time_ms: int, minimum_ms: int | None = None) -> None:
        """Pops must ask at least min_invisible_ms; a change (a nack) may ask down to 0."""
        pop = self._config.pop
        low = pop.min_invisible_ms if minimum_ms is None else minimum_ms
        if not low <= invisible_time_ms <= pop.max_invisible_ms:
            raise RefusedError(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible time {invisible_time_ms} ms is outside "
                f"[{low}, {pop.max_invisible_ms}] ms",
            )

    @staticmethod
    def _check_poll(poll_time_ms: int) -> None:
        if poll_time_ms < 0:
            raise RefusedError(Code.ILLEGAL_POLLING_TIME, "poll time must not be negative")

    # -- pop ------------------------------------------------------------------------------
    async def pop(self, request: PopRequest) -> PopResult:
        check_group(request.group)
        check_topic(request.topic, allow_dlq=True)  # a group reads its own dead letters
        count = self._queue_count(request.topic)
        self._check_queue(request.queue_id, count, request.topic)
        if not 1 <= request.max_messages <= self._config.pop.max_batch:
            raise RefusedError(
                Code.BAD_REQUEST,
                f"batch size {request.max_messages} is outside [1, {self._config.pop.max_batch}]",
            )
        self._check_invisible(request.invisible_time_ms)
        self._check_poll(request.poll_time_ms)
        request.filter.check()
        fifo = request.fifo or self._groups.get(request.group).fifo
        tags = request.filter.tags()
        deadline = self._clock() + request.poll_time_ms
        while True:
            scan = _ScanBudget()
            result = self._pop_once(request, count, fifo, tags, scan)
            remaining = deadline - self._clock()
            if result.messages:
                if result.rest_num > 0:  # more is there: let the next held consumer have it
                    self._hold.wake(request.topic, request.group, request.queue_id)
                    if not fifo:
                        self._hold.wake(
                            retry_topic(request.group, request.topic), request.group, -1
                        )
                return result
            if remaining <= 0:
                return result
            if scan.cut:  # SQL92 passed over a long unmatched run: others first, then on
                await anyio.lowlevel.checkpoint()
                continue
            outcome = await self._hold.wait(
                self._hold_keys(request.group, request.topic, request.queue_id, fifo),
                remaining,
                tags,
            )
            if outcome is HoldOutcome.FULL:
                return PopResult(PopStatus.POLLING_FULL, rest_num=result.rest_num)
            if outcome is HoldOutcome.TIMEOUT:
                return self._pop_once(request, count, fifo, tags)
            if self._config.polling.fill_window_turns and not self._hold.closed:
                await self._fill_window(request, fifo, deadline)  # not when the broker stops

    async def _fill_window(self, request: PopRequest, fifo: bool, deadline: int) -> None:
        """A held pop woken by an arrival lets the loop run up to
        ``polling.fill_window_turns`` more turns, for at most ``polling.fill_window_ms`` and
        never into the end of its poll time (its last ``_ENDING_MS``, or ``_ENDING_SHARE``
        of a shorter one: a pop woken there pops at once), before it pops: sends that land
        meanwhile ride this pop (fuller receives, fewer receives and acks per message). On
        an idle loop a turn takes microseconds; on a busy one the sends of one burst land
        within a few turns.
        Cancelled here, it hands its wake on, as a woken pop cancelled in the hold table
        does: a message that woke it is never left without a woken pop. The broker stopping
        meanwhile (the hold table closed) ends the window at once: the pop is made with
        those the close woke, before the broker journals what is in flight and closes its
        files (a pop made after that was handed out again at once after a restart)."""
        polling = self._config.polling
        hold = self._hold
        now = self._clock()
        # About to end (its caller's deadline, here or at the proxy, is as near): at once.
        ending_at = deadline - min(_ENDING_MS, _ENDING_SHARE * request.poll_time_ms)
        if now >= ending_at:
            return
        until = min(now + polling.fill_window_ms, ending_at)
        try:
            for _ in range(polling.fill_window_turns):
                await asyncio.sleep(0)
                if hold.closed or self._clock() >= until:
                    return
        except BaseException:
            self._hold.wake(request.topic, request.group, request.queue_id)
            if not fifo:
                self._hold.wake(retry_topic(request.group, request.topic), request.group, -1)
            raise

    @staticmethod
    def _hold_keys(group: str, topic: str, queue_id: int, fifo: bool) -> list[HoldKey]:
        keys: list[HoldKey] = [(topic, group, queue_id)]
        if not fifo:
            keys.append((retry_topic(group, topic), group, -1))
        return keys

    def _retry_queues(self, group: str, topic: str, start: int = 0) -> list[tuple[str, int]]:
        """The group's retry queues for a topic: the V2 retry topic, and the V1 one if data
        from before the upgrade is still there (read until drained; nothing new goes there)."""
        queues: list[tuple[str, int]] = []
        for name in (retry_topic(group, topic), legacy_retry_topic(group, topic)):
            meta = self._store.get_topic(name)
            if meta is not None:
                queues += [(name, q) for q in pop_queue_order(meta.queue_count, start)]
        return queues

    def _pop_once(
        self,
        request: PopRequest,
        count: int,
        fifo: bool,
        tags: frozenset[str] | None,
        scan: _ScanBudget | None = None,
    ) -> PopResult:
        group, topic = request.group, request.topic
        now = self._clock()
        start = self._rng.randrange(max(count, 1))
        if request.queue_id == -1:
            normal = [(topic, q) for q in pop_queue_order(count, start)]
        else:
            normal = [(topic, request.queue_id)]
        retry: list[tuple[str, int]] = []
        retry_first = False
        if not fifo:
            retry = self._retry_queues(group, topic, start)
            retry_first = self._rng.randrange(100) < self._config.pop.retry_first_percent
        plan = retry + normal if retry_first else normal + retry
        out: list[PoppedMessage] = []
        rest = 0
        scan = scan or _ScanBudget()
        for queue_topic, queue_id in plan:
            rest += self._pop_queue(request, queue_topic, queue_id, fifo, tags, now, out, scan)
        self._ledger.flush_commits()
        status = PopStatus.FOUND if out else PopStatus.NO_MESSAGE
        return PopResult(status, out, rest)

    def _pop_queue(
        self,
        request: PopRequest,
        topic: str,
        queue_id: int,
        fifo: bool,
        tags: frozenset[str] | None,
        now: int,
        out: list[PoppedMessage],
        scan: _ScanBudget,
    ) -> int:
        """Pop what fits from one queue into ``out``; returns the backlog left there."""
        group = request.group
        key = (group, topic, queue_id)
        select = request.filter.selects()  # SQL92: on properties, after the read
        max_offset = self._store.max_offset(topic, queue_id)
        idle = self._ledger.existing_queue(group, topic, queue_id)
        if idle is not None and idle.pop_offset == max_offset and not idle.released:
            return 0  # read up to the end and nothing to redeliver: most queues, most pops
        if not self.locks.try_lock(key):  # busy: skip it, but count its backlog
            state = self._ledger.queue(group, topic, queue_id)
            return self._rest(topic, queue_id, state.pop_offset, max_offset, tags)
        try:
            state = self._ledger.queue(group, topic, queue_id)
            if state.pop_offset > max_offset:
                # The queue is shorter than our progress (e.g. the store dropped a torn tail
                # after a power cut): continue from its end rather than wait forever.
                self._ledger.reset_queue(group, topic, queue_id, max_offset)
                state = self._ledger.queue(group, topic, queue_id)
            room = request.max_messages - len(out)
            if room <= 0 or (fifo and state.inflight):
                return self._rest(topic, queue_id, state.pop_offset, max_offset, tags)
            picked: list[StoredMessage] = []
            gone: list[int] = []
            for offset in state.take_released(room):
                message = self._read_at(topic, queue_id, offset)
                if message is None:
                    gone.append(offset)
                    self._ledger.finish_gone_offset(group, topic, queue_id, offset)
                elif (tags is not None and message.tag not in tags) or (
                    select is not None and not select(message)
                ):
                    self._ledger.finish_offset(group, topic, queue_id, offset)
                else:
                    picked.append(message)
            if gone:
                log_gone(group, topic, queue_id, gone, "released for redelivery")
            cursor = state.pop_offset
            while len(picked) < room and cursor < max_offset:
                if select is not None and scan.left <= 0:
                    scan.cut = True
                    break
                want = room - len(picked)
                if select is not None:  # most may not match: read a batch, stop once full
                    want = max(want, _SQL_SCAN_BATCH)
                try:
                    result = self._store.read(topic, queue_id, cursor, want, tags)
                except RefusedError as err:
                    if err.code != Code.ILLEGAL_OFFSET:
                        raise
                    low = self._store.min_offset(topic, queue_id)
                    if cursor >= low:
                        break  # beyond the end: nothing to read
                    cursor = low  # retention removed what was below
                    continue
                # What the filter leaves out is passed over like tag-filtered messages: the
                # cursor moves beyond it, so it counts as consumed for this group.
                next_offset = result.next_offset
                for m in result.messages:
                    if len(picked) >= room:  # a SQL92 batch read beyond what fits
                        next_offset = m.queue_offset
                        break
                    if (
                        not state.is_known(m.queue_offset)
                        and self._owns(request, topic, m)
                        and (select is None or select(m))
                    ):
                        picked.append(m)
                if next_offset <= cursor:
                    break
                if select is not None:
                    scan.left -= next_offset - cursor
                cursor = next_offset
            if picked:
                self._hand_out(request, topic, queue_id, fifo, picked, now, out)
            self._ledger.advance_cursor(group, topic, queue_id, cursor)
            return self._rest(topic, queue_id, cursor, max_offset, tags)
        finally:
            self.locks.unlock(key)

    @staticmethod
    def _owns(request: PopRequest, topic: str, message: StoredMessage) -> bool:
        """False for a message of a V1 retry topic that another (group, topic) pair shares
        (``%RETRY%a_b_c`` is both a_b/c's and a/b_c's): its origin topic says whose it is.
        Skipping it only moves this group's cursor; its owner reads it with its own."""
        if topic != legacy_retry_topic(request.group, request.topic):
            return True
        return message.properties.get(PROP_ORIGIN_TOPIC, request.topic) == request.topic

    def _rest(
        self, topic: str, queue_id: int, cursor: int, max_offset: int, tags: frozenset[str] | None
    ) -> int:
        if cursor >= max_offset:
            return 0
        if tags is None:
            return max_offset - cursor
        return self._store.count_matching(topic, queue_id, cursor, max_offset, tags)

    def _read_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        try:
            result = self._store.read(topic, queue_id, offset, 1)
        except RefusedError:
            return None
        if result.messages and result.messages[0].queue_offset == offset:
            return result.messages[0]
        return None

    def _hand_out(
        self,
        request: PopRequest,
        topic: str,
        queue_id: int,
        fifo: bool,
        picked: list[StoredMessage],
        now: int,
        out: list[PoppedMessage],
    ) -> None:
        state = self._ledger.queue(request.group, topic, queue_id)
        attempts = [state.attempts.get(m.queue_offset, m.reconsume_times) for m in picked]
        until = now + request.invisible_time_ms
        ck = self._ledger.open(
            request.group,
            topic,
            queue_id,
            [m.queue_offset for m in picked],
            attempts,
            now,
            until,
            fifo,
        )
        handles = self._codec.encode_batch(
            self._name, group_hash(request.group), topic, queue_id, ck.offsets, now, until, ck.ck_id
        )
        is_retry = topic != request.topic
        for index, message in enumerate(picked):
            handle = handles[index]
            if attempts[index] != message.reconsume_times:
                message = replace(message, reconsume_times=attempts[index])
            if is_retry:  # consumers see the topic they subscribed to
                origin = message.properties.get(PROP_ORIGIN_TOPIC, request.topic)
                message = replace(message, topic=origin)
            out.append(PoppedMessage(message, handle, until))

    # -- handles --------------------------------------------------------------------------
    def _resolve(
        self, group: str, topic: str, text: str, now: int
    ) -> tuple[ReceiptHandle, Checkpoint, int]:
        """A handle's live checkpoint entry; INVALID_RECEIPT_HANDLE with the reason if none."""
        handle = self._codec.decode(text)
        if handle.broker != self._name:
            raise _invalid(f"the handle belongs to broker {handle.broker!r}, not {self._name!r}")
        if handle.group_hash != group_hash(group):
            raise _invalid(f"the handle was not issued to consumer group {group!r}")
        if handle.topic != topic and handle.topic not in (  # (names built only for a retry)
            retry_topic(group, topic),
            legacy_retry_topic(group, topic),
        ):
            raise _invalid(f"the handle is for topic {handle.topic!r}, not {topic!r}")
        ck = self._ledger.find(handle.checkpoint_id)
        index = handle.index
        # Decisions use the checkpoint's own state (deadline, pop time, offsets), never what
        # the handle claims: the handle only names an entry.
        if (
            ck is None
            or ck.group != group
            or ck.pop_time_ms != handle.pop_time_ms
            or ck.topic != handle.topic
            or ck.queue_id != handle.queue_id
            or index >= len(ck.offsets)
            or ck.offsets[index] != handle.offset
        ):
            # Only the wording: a refusal either way (the handle is authentic, so its deadline
            # tells an expired entry from an unknown one).
            if now >= handle.invisible_until_ms:
                raise _expired(handle.invisible_until_ms)
            raise _invalid("unknown checkpoint (finished long ago, or lost in a broker restart)")
        state = ck.states[index]
        if state == EntryState.SUPERSEDED:
            raise _invalid("superseded by change_invisible_time: use the newest handle")
        if state == EntryState.ACKED:
            return handle, ck, index
        if state == EntryState.DROPPED:
            raise _invalid(f"the message is {GONE_REASON}; it will not be redelivered")
        if state == EntryState.REVIVED and now < ck.invisible_until_ms:
            # Revives come only after the deadline: before it, only a client's forward.
            raise _invalid("the message was already forwarded to the dead-letter queue")
        forwarding = self._ledger.forwarding
        if forwarding and (ck.ck_id, index) in forwarding:
            raise _invalid("the message is being forwarded to the dead-letter queue")
        if state != EntryState.PENDING or now >= ck.invisible_until_ms:
            raise _expired(ck.invisible_until_ms)
        return handle, ck, index

    # -- ack ------------------------------------------------------------------------------
    async def ack(self, group: str, topic: str, entries: list[AckEntry]) -> list[AckEntryResult]:
        check_group(group)
        check_topic(topic, allow_dlq=True)
        now = self._clock()
        results: list[AckEntryResult] = []
        for entry in entries:
            try:
                _, ck, index = self._resolve(group, topic, entry.receipt_handle, now)
                if ck.states[index] == EntryState.PENDING:
                    self._ledger.ack(ck, index)
                    if ck.fifo:
                        self._wake_if_unblocked(ck)
                results.append(AckEntryResult(entry.receipt_handle, entry.message_id, Code.OK))
            except RefusedError as err:
                results.append(
                    AckEntryResult(entry.receipt_handle, entry.message_id, err.code, err.message)
                )
        self._ledger.flush_commits()
        self._journal.flush()
        return results

    def hand_back(self, group: str, topic: str, receipt_handles: list[str]) -> int:
        """Popped messages no consumer received (a proxy's long poll ended before it could
        deliver them; a replicated pop whose barrier failed) go back to their queues, visible
        at once and with no delivery attempt counted, instead of through the retry topic with
        its back-off (a change of invisible time to 0 is a failed delivery). FIFO: in place,
        in order, and the queue is free again once nothing else is in flight. Handles no
        longer pending (acked, changed, expired, unknown) are skipped. Returns how many."""
        check_group(group)
        check_topic(topic, allow_dlq=True)
        now = self._clock()
        woken: set[tuple[str, int]] = set()
        count = 0
        for text in receipt_handles:
            try:
                _, ck, index = self._resolve(group, topic, text, now)
            except RefusedError:
                continue  # acked, changed or revived meanwhile: nothing to hand back
            if ck.states[index] != EntryState.PENDING:
                continue
            self._ledger.release(ck, index, attempted=False)
            woken.add((ck.topic, ck.queue_id))
            count += 1
        self._ledger.flush_commits()
        self._journal.flush()
        for queue_topic, queue_id in woken:
            self._hold.wake(queue_topic, group, queue_id)
        return count

    def _wake_if_unblocked(self, ck: Checkpoint) -> None:
        state = self._ledger.existing_queue(*ck.queue_key)
        if state is not None and not state.inflight:
            self._hold.wake(ck.topic, ck.group, ck.queue_id)

    async def change_invisible_time(
        self, group: str, topic: str, receipt_handle: str, invisible_time_ms: int
    ) -> ChangeInvisibleResult:
        check_group(group)
        check_topic(topic, allow_dlq=True)
        self._check_invisible(invisible_time_ms, minimum_ms=0)
        now = self._clock()
        handle, ck, index = self._resolve(group, topic, receipt_handle, now)
        if ck.states[index] != EntryState.PENDING:
            raise _invalid("the message was already acked")
        until = now + invisible_time_ms
        new = self._ledger.change(ck, index, now, until)
        self._journal.flush()
        text = self._codec.encode(
            replace(
                handle, pop_time_ms=now, invisible_until_ms=until, checkpoint_id=new.ck_id, index=0
            )
        )
        return ChangeInvisibleResult(text, until)

    def take_for_dlq(self, group: str, topic: str, receipt_handle: str) -> tuple[Checkpoint, int]:
        """The pending entry a forward_to_dlq request names (validated like an ack), claimed
        for the forward before anything awaits: until ReviveService.forward_to_dlq ends, an
        ack, hand-back, change, revive or second forward of it is refused or skipped, so the
        message cannot end up both in the DLQ and delivered again (short of a forward failing
        or cancelled after its copy was written: then it revives, a duplicate, never lost)."""
        check_group(group)
        check_topic(topic, allow_dlq=True)
        _, ck, index = self._resolve(group, topic, receipt_handle, self._clock())
        if ck.states[index] != EntryState.PENDING:
            raise _invalid("the message was already acked")
        self._ledger.forwarding.add((ck.ck_id, index))
        return ck, index

    # -- notify ---------------------------------------------------------------------------
    async def notify(self, request: NotifyRequest) -> NotifyResult:
        check_group(request.group)
        check_topic(request.topic, allow_dlq=True)  # a group reads its own dead letters
        count = self._queue_count(request.topic)
        self._check_queue(request.queue_id, count, request.topic)
        self._check_poll(request.poll_time_ms)
        request.filter.check()
        fifo = request.fifo or self._groups.get(request.group).fifo
        tags = request.filter.tags()
        select = request.filter.selects()
        deadline = self._clock() + request.poll_time_ms
        while True:
            scan = _ScanBudget()
            if self.has_visible(
                request.group, request.topic, request.queue_id, count, fifo, tags, select, scan
            ):
                return NotifyResult(True)
            remaining = deadline - self._clock()
            if remaining <= 0:
                return NotifyResult(False)
            if scan.cut:  # SQL92 moved past an unmatched run and there is more: look on
                await anyio.lowlevel.checkpoint()
                continue
            outcome = await self._hold.wait(
                self._hold_keys(request.group, request.topic, request.queue_id, fifo),
                remaining,
                tags,
                broadcast=True,
            )
            if outcome is HoldOutcome.FULL:
                return NotifyResult(False, polling_full=True)
            if outcome is HoldOutcome.TIMEOUT:
                return NotifyResult(
                    self.has_visible(
                        request.group, request.topic, request.queue_id, count, fifo, tags, select
                    )
                )

    def has_visible(
        self,
        group: str,
        topic: str,
        queue_id: int,
        count: int,
        fifo: bool,
        tags: frozenset[str] | None,
        select: Callable[[StoredMessage], bool] | None = None,
        scan: _ScanBudget | None = None,
    ) -> bool:
        """Is a message visible to the group (one the filter takes: tags from the index, a
        SQL92 ``select`` on the messages read)? Non-matching arrivals do not count. ``scan``
        is told when a SQL92 check stopped on its limit with more to read."""
        queues = [(topic, q) for q in range(count)] if queue_id == -1 else [(topic, queue_id)]
        if not fifo:
            queues += self._retry_queues(group, topic)
        scan = scan or _ScanBudget()
        return any(
            self._queue_has_visible(group, t, q, fifo, tags, select, scan) for t, q in queues
        )

    def _queue_has_visible(
        self,
        group: str,
        topic: str,
        queue_id: int,
        fifo: bool,
        tags: frozenset[str] | None,
        select: Callable[[StoredMessage], bool] | None = None,
        scan: _ScanBudget | None = None,
    ) -> bool:
        state = self._ledger.queue(group, topic, queue_id)
        if fifo and state.inflight:
            return False
        if state.released:
            return True
        max_offset = self._store.max_offset(topic, queue_id)
        # Below the queue's min offset retention removed everything: the pop skips it too.
        cursor = max(state.pop_offset, self._store.min_offset(topic, queue_id))
        if cursor >= max_offset:
            return False
        if select is not None:
            return self._selected_visible(
                group, topic, queue_id, cursor, max_offset, select, scan or _ScanBudget()
            )
        if tags is None:
            # Every offset from the cursor on is a candidate: no need to look at the store.
            end = min(max_offset, cursor + _NOTIFY_SCAN_READS * 32)
            return any(not state.is_known(offset) for offset in range(cursor, end))
        # Filtered: the index's tag hashes say which offsets match, without decoding records.
        for _ in range(_NOTIFY_SCAN_READS):
            if cursor >= max_offset:
                return False
            try:
                offsets, next_offset = self._store.peek_offsets(topic, queue_id, cursor, 32, tags)
            except RefusedError:
                return False
            if any(not state.is_known(offset) for offset in offsets):
                return True
            if next_offset <= cursor:
                return False
            cursor = next_offset
        return False

    def _selected_visible(
        self,
        group: str,
        topic: str,
        queue_id: int,
        cursor: int,
        max_offset: int,
        select: Callable[[StoredMessage], bool],
        scan: _ScanBudget,
    ) -> bool:
        """SQL92: read from the cursor until a message the filter takes. What it passes over
        a pop would pass over too, so the group's cursor moves beyond it (when the queue is
        free): later checks, woken by later arrivals, start after it instead of rescanning
        (and a long run of non-matching messages cannot hide a match behind the scan limit)."""
        state = self._ledger.queue(group, topic, queue_id)
        key = (group, topic, queue_id)
        locked = self.locks.try_lock(key)
        found = False
        try:
            for _ in range(_SQL_SCAN_READS):
                if cursor >= max_offset:
                    break
                try:
                    result = self._store.read(topic, queue_id, cursor, _SQL_SCAN_BATCH)
                except RefusedError:
                    break
                for message in result.messages:
                    if not state.is_known(message.queue_offset) and select(message):
                        found = True
                        cursor = message.queue_offset
                        break
                if found or result.next_offset <= cursor:
                    break
                cursor = result.next_offset
            if locked and cursor > state.pop_offset:
                self._ledger.advance_cursor(group, topic, queue_id, cursor)
                self._ledger.flush_commits()
                # Moved on and not at the end: the caller may look again at once (it would
                # otherwise wait for an arrival while a match sits further on).
                scan.cut = scan.cut or (not found and cursor < max_offset)
        finally:
            if locked:
                self.locks.unlock(key)
        return found


def _invalid(reason: str) -> RefusedError:
    return RefusedError(Code.INVALID_RECEIPT_HANDLE, f"invalid receipt handle: {reason}")


def _expired(visible_at_ms: int) -> RefusedError:
    return RefusedError(
        Code.INVALID_RECEIPT_HANDLE,
        f"receipt handle expired: the message became visible again at "
        f"{visible_at_ms} ms (it is or will be redelivered)",
    )
