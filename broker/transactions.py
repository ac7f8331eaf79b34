"""Transactional messages, as RocketMQ 5 keeps them: half messages and op records.

A transactional send stores a *half message* in ``%SYS%TRANS_HALF`` (queue 0; no consumer
reads system topics) with its real topic and queue in properties. A decision is an *op record*
in ``%SYS%TRANS_OP`` whose body is the half message's offset: COMMIT (written after the message
was appended to its real topic, with its original id, keys, tag and properties), ROLLBACK,
CHECK (one check-back was handed to a producer) or PARK (no answer after ``max_checks``
checks: an operator decides). A parked half message is copied to ``%SYS%TRANS_CHECK_MAX``
(RocketMQ's TRANS_CHECK_MAX_TIME_TOPIC) before its PARK record, so the half topic's progress
moves past it; a commit reads it from there. All three topics are ordinary stored messages, so
a kill -9 loses neither a half message nor a decision; ``recover`` rebuilds the undecided set
by reading the half topic from the committed progress, the parked topic and the op topic from
their start. Data directories from before the parked topic have halves parked in place (a PARK
record without ``__popmq.tx_parked_at``): they are read from the half topic, and moved to the
parked topic by the broker's transaction loop.

Like RocketMQ, a crash between a commit's append and its op record leaves the half message
undecided: the producer is asked again, and a second COMMIT delivers it a second time (at least
once, never lost).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import (
    PROP_CHECK_IMMUNITY,
    PROP_TX_TRACE,
    Message,
    StoredMessage,
)
from popmq.broker.pop.queue_state import QueueState
from popmq.broker.timer import stored_to_message

from popmq.tracing import continue_from, current_traceparent, link_to, tracer

if TYPE_CHECKING:
    from popmq.broker.store.message_store import MessageStore

log = logging.getLogger(__name__)

HALF_TOPIC = "%SYS%TRANS_HALF"
OP_TOPIC = "%SYS%TRANS_OP"
PARKED_TOPIC = "%SYS%TRANS_CHECK_MAX"
HALF_QUEUE = 0
PROGRESS_GROUP = "%SYS%TRANS_PROGRESS"
PROP_REAL_TOPIC = "__popmq.tx_topic"
PROP_REAL_QUEUE = "__popmq.tx_queue"
PROP_OP = "__popmq.tx_op"
PROP_PARKED_AT = "__popmq.tx_parked_at"  # on a PARK op record: the copy's parked-topic offset
PROP_HALF_OFFSET = "__popmq.tx_half_offset"  # on a parked copy: its half message's offset
PROP_HALF_STORED = "__popmq.tx_half_stored_ms"  # ... and when the half message was stored
_INTERNAL = (PROP_REAL_TOPIC, PROP_REAL_QUEUE, PROP_HALF_OFFSET, PROP_HALF_STORED)
COMMIT, ROLLBACK, CHECK, PARK = "COMMIT", "ROLLBACK", "CHECK", "PARK"
_ENDED_REMEMBERED = 100_000  # decisions kept for idempotent repeats (older: "ended")
_SCAN_BATCH = 512


@dataclass(slots=True)
class HalfMessage:
    """An undecided half message (what the checks and the admin listing need)."""

    offset: int
    message_id: str
    topic: str
    stored_ms: int
    immunity_ms: int
    checks: int = 0
    next_check_ms: int = 0
    parked: bool = False
    # Where the parked copy is in PARKED_TOPIC; None while open, or parked in place (older
    # data directories: the half topic still holds it).
    parked_offset: int | None = None
    trace: str = ""  # the half send's traceparent (PROP_TX_TRACE), '' when untraced


@dataclass(slots=True)
class CheckDue:
    """A check-back to hand to a producer of ``message.topic``."""

    message: StoredMessage  # as the producer sent it (real topic, original id)
    half_offset: int
    checks: int  # including this one


class TransactionService:
    def __init__(
        self,
        store: MessageStore,
        clock: Callable[[], int],
        ensure_topic: Callable[[str], bool],
        check_immunity_ms: int,
        check_interval_ms: int,
        max_checks: int,
    ) -> None:
        self._store = store
        self._clock = clock
        self._ensure_topic = ensure_topic
        self.check_immunity_ms = check_immunity_ms
        self.check_interval_ms = check_interval_ms
        self.max_checks = max_checks
        self._pending: dict[int, HalfMessage] = {}
        self._ended: OrderedDict[int, str] = OrderedDict()
        self._deciding: dict[int, str] = {}  # offset -> decision being written
        self._progress = QueueState(0)
        # Counters since start (the broker's metrics read them).
        self.prepared = 0
        self.committed = 0
        self.rolled_back = 0
        self.checks = 0
        self.parked = 0

    # -- reads --------------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def parked_now(self) -> int:
        return sum(1 for half in self._pending.values() if half.parked)

    def trace_of(self, offset: int) -> str:
        """The traceparent of an undecided half message's send ('' if none or not traced)."""
        half = self._pending.get(offset)
        return half.trace if half is not None else ""

    def halves(self) -> list[HalfMessage]:
        return sorted(self._pending.values(), key=lambda h: h.offset)

    def load(self, offset: int) -> StoredMessage | None:
        """The half message at ``offset`` as its producer sent it (real topic), from the
        parked topic once it was moved there."""
        half = self._pending.get(offset)
        if half is not None and half.parked_offset is not None:
            stored = self._read(PARKED_TOPIC, half.parked_offset)
        else:
            stored = self._read(HALF_TOPIC, offset)
        if stored is None:
            return None
        properties = dict(stored.properties)
        topic = properties.get(PROP_REAL_TOPIC, stored.topic)
        queue = properties.get(PROP_REAL_QUEUE, "0")
        for name in _INTERNAL:
            properties.pop(name, None)
        return replace(
            stored, topic=topic, queue_id=int(queue) if queue.isdigit() else 0,
            properties=properties,
        )  # fmt: skip

    def _read(self, topic: str, offset: int) -> StoredMessage | None:
        try:
            result = self._store.read(topic, HALF_QUEUE, offset, 1)
        except RefusedError:
            return None
        if not result.messages or result.messages[0].queue_offset != offset:
            return None
        return result.messages[0]

    # -- recovery -----------------------------------------------------------------------------
    def recover(self) -> int:
        """Rebuild the undecided set from the half and op topics; returns its size."""
        self._ensure_topic(HALF_TOPIC)
        self._ensure_topic(OP_TOPIC)
        self._ensure_topic(PARKED_TOPIC)
        start = max(
            self._store.get_consumer_offset(PROGRESS_GROUP, HALF_TOPIC, HALF_QUEUE),
            self._store.min_offset(HALF_TOPIC, HALF_QUEUE),
        )
        self._progress = QueueState(start)
        self._pending = {}
        end = self._store.max_offset(HALF_TOPIC, HALF_QUEUE)
        for stored in self._scan(HALF_TOPIC, start, end):
            self._track(stored)
        self._progress.advance_cursor(end)
        parked_end = self._store.max_offset(PARKED_TOPIC, HALF_QUEUE)
        parked_start = self._store.min_offset(PARKED_TOPIC, HALF_QUEUE)
        for copy in self._scan(PARKED_TOPIC, parked_start, parked_end):
            self._track_parked(copy)
        op_end = self._store.max_offset(OP_TOPIC, HALF_QUEUE)
        for op in self._scan(OP_TOPIC, self._store.min_offset(OP_TOPIC, HALF_QUEUE), op_end):
            try:
                offset = int(op.body)
            except ValueError:
                log.warning("transactions: op record %d has no half offset; skipped",
                            op.queue_offset)  # fmt: skip
                continue
            kind = op.properties.get(PROP_OP, "")
            half = self._pending.get(offset)
            if kind in (COMMIT, ROLLBACK):
                self._remember(offset, kind)
                if half is not None:
                    self._settle(offset)
            elif half is not None and kind == CHECK:
                half.checks += 1
                half.next_check_ms = op.store_timestamp_ms + self.check_interval_ms
            elif half is not None and kind == PARK:
                half.parked = True
        return len(self._pending)

    def _track_parked(self, copy: StoredMessage) -> None:
        """A parked copy found at recovery: its half message is undecided unless an op record
        says otherwise (read next)."""
        offset_text = copy.properties.get(PROP_HALF_OFFSET, "")
        if not offset_text.isdigit():
            log.warning("transactions: parked record %d names no half message; skipped",
                        copy.queue_offset)  # fmt: skip
            return
        offset = int(offset_text)
        half = self._pending.get(offset)
        if half is None:  # the usual case: the half topic's progress is past it
            stored_ms = copy.properties.get(PROP_HALF_STORED, "")
            half = HalfMessage(
                offset, copy.message_id, copy.properties.get(PROP_REAL_TOPIC, ""),
                int(stored_ms) if stored_ms.isdigit() else copy.store_timestamp_ms,
                self.check_immunity_ms,
            )  # fmt: skip
            half.trace = copy.properties.get(PROP_TX_TRACE, "")
            self._pending[offset] = half
        else:  # a crash after the copy, before the half topic's progress was saved
            self._release_half(offset)
        half.parked = True
        half.parked_offset = copy.queue_offset

    def _scan(self, topic: str, start: int, end: int) -> list[StoredMessage]:
        found: list[StoredMessage] = []
        offset = start
        while offset < end:
            result = self._store.read(topic, HALF_QUEUE, offset, _SCAN_BATCH)
            found.extend(result.messages)
            if result.next_offset <= offset:
                break
            offset = result.next_offset
        return found

    def _track(self, stored: StoredMessage) -> None:
        immunity = self.check_immunity_ms
        seconds = stored.properties.get(PROP_CHECK_IMMUNITY, "")
        if seconds.isdigit():  # the message's own immunity may only lengthen it
            immunity = max(immunity, int(seconds) * 1000)
        half = HalfMessage(
            stored.queue_offset, stored.message_id,
            stored.properties.get(PROP_REAL_TOPIC, ""), stored.store_timestamp_ms, immunity,
        )  # fmt: skip
        half.next_check_ms = half.stored_ms + immunity
        half.trace = stored.properties.get(PROP_TX_TRACE, "")
        self._pending[half.offset] = half
        # An owner that is not None: QueueState.mark_done only drops an offset held by one.
        self._progress.add_inflight(half.offset, True)

    # -- produce ------------------------------------------------------------------------------
    async def prepare(self, entries: list[tuple[Message, str, int]]) -> list[StoredMessage]:
        """Store ``(message, real topic, real queue)`` as half messages. Traced, each keeps
        its half send's span (PROP_TX_TRACE), for the check and decision spans to join."""
        with tracer().start_as_current_span("popmq.transaction.half") as span:
            traceparent = current_traceparent()
            if span.is_recording():
                span.set_attribute("messaging.batch.message_count", len(entries))
                span.set_attribute("messaging.destination.name", entries[0][1])
            held: list[Message] = []
            for message, topic, queue_id in entries:
                properties = dict(message.properties)
                properties[PROP_REAL_TOPIC] = topic
                properties[PROP_REAL_QUEUE] = str(queue_id)
                if traceparent:
                    properties[PROP_TX_TRACE] = traceparent
                held.append(replace(message, topic=HALF_TOPIC, properties=properties))
            self._ensure_topic(HALF_TOPIC)
            stored = await self._store.append(HALF_TOPIC, HALF_QUEUE, held)
        for record in stored:
            self._track(record)
        self._progress.advance_cursor(stored[-1].queue_offset + 1)
        self.prepared += len(stored)
        return stored

    # -- decisions ----------------------------------------------------------------------------
    async def end(self, offset: int, message_id: str, topic: str, commit: bool) -> bool:
        """COMMIT (append to the real topic, then the op record) or ROLLBACK (the op record).
        True if decided now, False for a repeat of the decision already taken;
        INVALID_TRANSACTION_ID for another decision on an ended transaction."""
        decision = COMMIT if commit else ROLLBACK
        half = self._pending.get(offset)
        if half is None or offset in self._deciding:
            earlier = self._ended.get(offset) or self._deciding.get(offset)
            if earlier == decision:
                return False
            if earlier is not None:
                raise RefusedError(
                    Code.INVALID_TRANSACTION_ID,
                    f"transaction of message {message_id} was already "
                    f"{'committed' if earlier == COMMIT else 'rolled back'}",
                )
            raise RefusedError(
                Code.INVALID_TRANSACTION_ID,
                f"transaction of message {message_id} has already ended (or its half message "
                "is gone)",
            )
        if half.message_id != message_id or half.topic != topic:
            raise RefusedError(
                Code.INVALID_TRANSACTION_ID,
                f"the transaction id is not for message {message_id} of topic {topic!r}",
            )
        self._deciding[offset] = decision
        try:
            await self._decide(half, decision)
        finally:
            self._deciding.pop(offset, None)
        return True

    async def _decide(self, half: HalfMessage, decision: str) -> None:
        offset, message_id, topic, commit = (
            half.offset,
            half.message_id,
            half.topic,
            decision == COMMIT,
        )
        if commit:
            stored = self.load(offset)
            if stored is None:
                raise RefusedError(
                    Code.INVALID_TRANSACTION_ID,
                    f"the half message of {message_id} is gone (removed by retention)",
                )
            if not self._ensure_topic(topic):
                raise RefusedError(
                    Code.TOPIC_NOT_FOUND, f"topic {topic!r} was deleted; the commit has no home"
                )
            message = stored_to_message(stored)
            message.properties.pop(PROP_TX_TRACE, None)  # the half's, not the message's
            meta = self._store.get_topic(topic)
            queue_id = stored.queue_id
            if meta is not None and not 0 <= queue_id < meta.queue_count:
                queue_id %= meta.queue_count
            await self._store.append(topic, queue_id, [message])
        await self._op(offset, message_id, decision)
        self._remember(offset, decision)
        self._settle(offset)
        if commit:
            self.committed += 1
        else:
            self.rolled_back += 1

    async def _op(
        self, offset: int, message_id: str, kind: str, extra: dict[str, str] | None = None
    ) -> None:
        record = Message(OP_TOPIC, str(offset).encode(), message_id=message_id,
                         properties={PROP_OP: kind, **(extra or {})})  # fmt: skip
        self._ensure_topic(OP_TOPIC)
        await self._store.append(OP_TOPIC, HALF_QUEUE, [record])

    def _remember(self, offset: int, decision: str) -> None:
        self._ended[offset] = decision
        self._ended.move_to_end(offset)
        while len(self._ended) > _ENDED_REMEMBERED:
            self._ended.popitem(last=False)

    def _settle(self, offset: int) -> None:
        self._pending.pop(offset, None)
        self._release_half(offset)

    def _release_half(self, offset: int) -> None:
        """The half topic no longer needs ``offset`` (decided, or parked elsewhere)."""
        if self._progress.mark_done(offset):
            self._store.set_consumer_offset(
                PROGRESS_GROUP, HALF_TOPIC, HALF_QUEUE, self._progress.committed
            )

    # -- check-back ---------------------------------------------------------------------------
    async def claim_checks(self, topics: set[str], limit: int = 64) -> list[CheckDue]:
        """Half messages of ``topics`` due for a check: each claimed one is counted (a CHECK
        op record) and not due again for ``check_interval_ms``. One checked ``max_checks``
        times is parked instead."""
        now = self._clock()
        due = sorted(
            (h for h in self._pending.values()
             if not h.parked and h.next_check_ms <= now and h.topic in topics),
            key=lambda h: h.next_check_ms,
        )  # fmt: skip
        claimed: list[CheckDue] = []
        for half in due:
            if len(claimed) >= limit:
                break
            if half.checks >= self.max_checks:
                await self.park(half, f"no decision after {half.checks} checks")
                continue
            stored = self.load(half.offset)
            if stored is None:
                continue
            await self._op(half.offset, half.message_id, CHECK)
            half.checks += 1
            half.next_check_ms = now + self.check_interval_ms
            self.checks += 1
            claimed.append(CheckDue(stored, half.offset, half.checks))
        return claimed

    async def park_abandoned(self) -> int:
        """Park half messages nobody was asked about for their whole check window (no
        producer of their topic came): (max_checks + 1) intervals past their immunity. Also
        moves halves parked in place (older data directories) to the parked topic."""
        for half in [h for h in self._pending.values() if h.parked and h.parked_offset is None]:
            await self._move_to_parked(half)
        now = self._clock()
        window = (self.max_checks + 1) * self.check_interval_ms
        stale = [h for h in self._pending.values()
                 if not h.parked and h.stored_ms + h.immunity_ms + window <= now
                 and h.next_check_ms + self.check_interval_ms <= now]  # fmt: skip
        for half in stale:
            await self.park(half, "no producer of its topic answered a check in time")
        return len(stale)

    async def park(self, half: HalfMessage, reason: str) -> None:
        link = link_to(half.trace)
        with tracer().start_as_current_span(
            "popmq.transaction.park", context=continue_from(half.trace),
            links=[link] if link is not None else None,
            attributes={"messaging.message.id": half.message_id,
                        "messaging.destination.name": half.topic,
                        "popmq.transaction.checks": half.checks},
        ):  # fmt: skip
            await self._move_to_parked(half)
        self.parked += 1
        log.error(
            "transactions: half message %s of topic %s parked (%s): neither committed nor "
            "rolled back; resolve it with `popmq admin transactions`",
            half.message_id, half.topic, reason,
        )  # fmt: skip

    async def _move_to_parked(self, half: HalfMessage) -> None:
        """Copy the half message to the parked topic, then write the PARK record naming the
        copy; the half topic's progress may then pass it. A crash in between leaves a copy
        that recovery finds (and the half message parked all the same)."""
        raw = self._read(HALF_TOPIC, half.offset)
        if raw is None:  # retention removed it: nothing to move, it stays listed as parked
            if not half.parked:
                await self._op(half.offset, half.message_id, PARK)
            half.parked = True
            return
        copy = stored_to_message(raw, PARKED_TOPIC)
        copy.properties[PROP_HALF_OFFSET] = str(half.offset)
        copy.properties[PROP_HALF_STORED] = str(half.stored_ms)
        self._ensure_topic(PARKED_TOPIC)
        (stored,) = await self._store.append(PARKED_TOPIC, HALF_QUEUE, [copy])
        await self._op(half.offset, half.message_id, PARK,
                       {PROP_PARKED_AT: str(stored.queue_offset)})  # fmt: skip
        half.parked = True
        half.parked_offset = stored.queue_offset
        self._release_half(half.offset)
