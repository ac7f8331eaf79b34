"""Revive: what was popped and not acked in time comes back.

For each checkpoint past its invisible time, every un-acked message is
- (concurrent pops) rewritten with ``reconsume_times + 1`` to the group's retry topic
  ``%RETRY%group+topic`` after the backoff of that attempt (through the timer), or to
  ``%DLQ%group`` once its attempts reach the group's ``max_attempts``;
- (FIFO pops) released back into its own queue, to be redelivered in place and in order, or
  sent to the DLQ at ``max_attempts``.
Only after the rewrite is stored is the original marked done, so a crash in between duplicates
the message rather than losing it. The message id stays the same across retries and the origin
is kept in ``PROP_ORIGIN_*`` properties.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import (
    PROP_ORIGIN_MESSAGE_ID,
    PROP_ORIGIN_OFFSET,
    PROP_ORIGIN_QUEUE,
    PROP_ORIGIN_TOPIC,
    RETRY_PREFIX,
    Message,
    StoredMessage,
    dlq_topic,
    retry_topic,
)
from popmq.broker.isolation import FailureTracker, describe
from popmq.broker.names import parse_retry_topic
from popmq.broker.pop.checkpoint import Checkpoint, EntryState
from popmq.broker.pop.gone import GONE_REASON, log_gone
from popmq.broker.pop.groups import GroupRegistry
from popmq.broker.pop.hold import HoldTable
from popmq.broker.pop.journal import PopJournal
from popmq.broker.pop.ledger import CheckpointLedger
from popmq.broker.timer import TimerService, stored_to_message

if TYPE_CHECKING:
    from popmq.broker.store.message_store import MessageStore

log = logging.getLogger(__name__)

# A revive interrupted (cancelled) is retried this much later.
_RETRY_FAILED_MS = 1000
# Why a message was parked in a DLQ by a failing loop (not by max attempts).
PROP_PARKED_REASON = "__popmq.parked_reason"

AppendFn = Callable[[str, int, list[Message]], Awaitable[list[StoredMessage]]]


def with_origin(stored: StoredMessage, topic: str) -> Message:
    """A copy of ``stored`` bound for ``topic`` that remembers where it first came from."""
    message = stored_to_message(stored, topic)
    props = message.properties
    if PROP_ORIGIN_TOPIC not in props:
        props[PROP_ORIGIN_TOPIC] = stored.topic
        props[PROP_ORIGIN_QUEUE] = str(stored.queue_id)
        props[PROP_ORIGIN_OFFSET] = str(stored.queue_offset)
    props.setdefault(PROP_ORIGIN_MESSAGE_ID, stored.message_id)
    return message


class ReviveService:
    def __init__(
        self,
        *,
        store: MessageStore,
        ledger: CheckpointLedger,
        journal: PopJournal,
        hold: HoldTable,
        groups: GroupRegistry,
        timer: TimerService,
        append_system: AppendFn,
        clock: Callable[[], int],
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._journal = journal
        self._hold = hold
        self._groups = groups
        self._timer = timer
        self._append_system = append_system
        self._clock = clock
        self.revived = 0  # messages sent to retry topics or released in place
        # by checkpoint id; the first retry comes as soon as an interrupted revive's
        self.failures: FailureTracker[int] = FailureTracker(base_backoff_ms=_RETRY_FAILED_MS)
        self.dead_lettered = 0
        # (group, the messages' first topic) -> messages sent to the group's DLQ since start
        # (rocketmq_send_to_dlq_messages_total has both labels).
        self.dead_lettered_by: dict[tuple[str, str], int] = {}

    def next_due_ms(self) -> int | None:
        return self._ledger.next_due_ms()

    async def revive_due(self) -> int:
        """Revive every checkpoint whose invisible time has passed. Returns how many.

        Checkpoints are isolated from each other: one whose revive fails is retried alone
        with backoff and finally parked (its messages dead-lettered); the others go on."""
        checkpoints = self._ledger.take_due(self._clock())
        try:
            for position, ck in enumerate(checkpoints):
                try:
                    await self._revive(ck)
                    self.failures.succeeded(ck.ck_id, self._clock())
                    # Its settlement reaches the file (what followers copy) before the next
                    # checkpoint's copy is written: a promotion during the pass revives again
                    # only the checkpoint being revived, not every one before it.
                    self._ledger.flush_commits()
                    self._journal.flush()
                except Exception as exc:
                    await self._failed(ck, exc)
                except BaseException:  # cancelled: what is left revives later
                    retry_at = self._clock() + _RETRY_FAILED_MS
                    for left in checkpoints[position:]:
                        self._ledger.reschedule(left, retry_at)
                    raise
        finally:
            self._ledger.flush_commits()
            self._journal.flush()
        return len(checkpoints)

    async def _failed(self, ck: Checkpoint, exc: BaseException) -> None:
        park, backoff_ms = self.failures.failed(ck.ck_id, exc, self._clock())
        if park:
            try:
                moved = await self._dead_letter_pending(ck, f"revive failed: {describe(exc)}")
            except Exception as park_exc:  # stays in flight (never lost), retried slowly
                log.error(
                    "revive: checkpoint %d of %s on %s failed (%s) and could not be "
                    "dead-lettered (%s); retrying in %d ms",
                    ck.ck_id, ck.group, ck.topic, describe(exc), describe(park_exc), backoff_ms,
                )  # fmt: skip
            else:
                self.failures.parked_one(ck.ck_id)
                log.error(
                    "revive: checkpoint %d of %s on %s failed (%s): %d message(s) parked in %s",
                    ck.ck_id, ck.group, ck.topic, describe(exc), moved, dlq_topic(ck.group),
                )  # fmt: skip
                return
        else:
            log.warning(
                "revive: checkpoint %d of %s on %s failed (%s); retrying in %d ms",
                ck.ck_id, ck.group, ck.topic, describe(exc), backoff_ms,
            )  # fmt: skip
        self._ledger.reschedule(ck, self._clock() + backoff_ms)

    async def _dead_letter_pending(self, ck: Checkpoint, reason: str) -> int:
        """Park every pending message of ``ck`` in its group's DLQ and mark it done there."""
        dead: list[Message] = []
        indexes: list[int] = []
        gone: list[int] = []
        for index in self._due_indexes(ck):
            stored = self._read(ck, index)
            if stored is None:
                gone.append(index)
                continue
            message = with_origin(stored, dlq_topic(ck.group))
            message.reconsume_times = max(stored.reconsume_times, ck.attempts[index]) + 1
            message.delivery_timestamp_ms = 0
            message.properties[PROP_PARKED_REASON] = reason[:500]
            dead.append(message)
            indexes.append(index)
        self._drop_gone(ck, gone, "due to be parked in the DLQ")
        if dead:
            await self._to_dlq(ck.group, dead)
        for index in indexes:
            self._ledger.revived(ck, index)
        self.dead_lettered += len(dead)
        return len(dead)

    async def _to_dlq(self, group: str, messages: list[Message]) -> None:
        await self._append_system(dlq_topic(group), 0, messages)
        counts = self.dead_lettered_by
        for message in messages:
            key = (group, message.properties.get(PROP_ORIGIN_TOPIC, ""))
            counts[key] = counts.get(key, 0) + 1

    def _due_indexes(self, ck: Checkpoint) -> list[int]:
        """The pending entries of ``ck`` to revive now. One a client's forward_to_dlq has
        claimed is left to that forward (reviving it too would deliver it again besides its
        DLQ copy); the checkpoint is looked at again shortly in case the forward fails."""
        pending = ck.pending_indexes()
        claimed = self._ledger.forwarding
        if not claimed:
            return pending
        free = [index for index in pending if (ck.ck_id, index) not in claimed]
        if len(free) < len(pending):
            self._ledger.reschedule(ck, self._clock() + _RETRY_FAILED_MS)
        return free

    def _drop_gone(self, ck: Checkpoint, gone: list[int], when: str) -> None:
        """Finish entries whose message is no longer in the store: logged and counted."""
        for index in gone:
            self._ledger.dropped(ck, index)
        if gone:
            offsets = [ck.offsets[index] for index in gone]
            log_gone(ck.group, ck.topic, ck.queue_id, offsets, when)

    def _read(self, ck: Checkpoint, index: int) -> StoredMessage | None:
        offset = ck.offsets[index]
        try:
            result = self._store.read(ck.topic, ck.queue_id, offset, 1)
        except RefusedError:
            return None
        if result.messages and result.messages[0].queue_offset == offset:
            return result.messages[0]
        return None

    async def _revive(self, ck: Checkpoint) -> None:
        max_attempts = self._groups.settings(ck.group).max_attempts
        if ck.fifo:
            await self._release_fifo(ck, max_attempts)
            return
        subscribed = self._subscribed_topic(ck)
        now = self._clock()
        retries: list[tuple[Message, str, int]] = []
        dead: list[Message] = []
        done: list[int] = []
        gone: list[int] = []
        config = self._groups.settings(ck.group)
        for index in self._due_indexes(ck):
            stored = self._read(ck, index)
            if stored is None:
                gone.append(index)
                continue
            reconsume = stored.reconsume_times + 1
            if reconsume >= max_attempts:
                message = with_origin(stored, dlq_topic(ck.group))
                message.reconsume_times = reconsume
                message.delivery_timestamp_ms = 0
                dead.append(message)
            else:
                target = retry_topic(ck.group, subscribed or stored.properties.get(
                    PROP_ORIGIN_TOPIC, ck.topic))  # fmt: skip
                message = with_origin(stored, target)
                message.reconsume_times = reconsume
                message.delivery_timestamp_ms = now + self._groups.retry_delay_ms(config, reconsume)
                retries.append((message, target, 0))
            done.append(index)
        self._drop_gone(ck, gone, "due for redelivery")
        if retries:
            await self._timer.schedule(retries)
        if dead:
            await self._to_dlq(ck.group, dead)
        for index in done:
            self._ledger.revived(ck, index)
        self.revived += len(retries)
        self.dead_lettered += len(dead)

    @staticmethod
    def _subscribed_topic(ck: Checkpoint) -> str | None:
        """The topic the group's consumers read ``ck`` through (its retries go to that
        topic's retry topic); None for a V1 retry topic, whose messages name it as their
        origin (the pop only hands them to that topic's consumers)."""
        if not ck.topic.startswith(RETRY_PREFIX):
            return ck.topic
        parsed = parse_retry_topic(ck.topic)
        return parsed[1] if parsed is not None else None

    async def _release_fifo(self, ck: Checkpoint, max_attempts: int) -> None:
        released = False
        for index in self._due_indexes(ck):
            if ck.attempts[index] + 1 < max_attempts:
                self._ledger.release(ck, index)  # a gone one is seen when popped again
                self.revived += 1
                released = True
                continue
            stored = self._read(ck, index)
            if stored is None:
                self._drop_gone(ck, [index], "due to go to the DLQ")
                continue
            message = with_origin(stored, dlq_topic(ck.group))
            message.reconsume_times = ck.attempts[index] + 1
            await self._to_dlq(ck.group, [message])
            self.dead_lettered += 1
            self._ledger.revived(ck, index)
        state = self._ledger.existing_queue(*ck.queue_key)
        if released or (state is not None and not state.inflight):
            self._hold.wake(ck.topic, ck.group, ck.queue_id)

    async def forward_to_dlq(self, ck: Checkpoint, index: int) -> None:
        """Client-requested: move one popped message to the DLQ now and mark it done. The
        entry was claimed by PopEngine.take_for_dlq; the claim ends here, whatever happens
        (if the DLQ write fails, the entry is still pending and revives at its deadline)."""
        try:
            stored = self._read(ck, index)
            if stored is None:
                self._ledger.dropped(ck, index)
                log_gone(ck.group, ck.topic, ck.queue_id, [ck.offsets[index]],
                         "asked to be forwarded to the DLQ")  # fmt: skip
                reason = f"cannot forward to the DLQ: the message is {GONE_REASON}"
                raise RefusedError(Code.MESSAGE_NOT_FOUND, reason)
            message = with_origin(stored, dlq_topic(ck.group))
            message.reconsume_times = max(stored.reconsume_times, ck.attempts[index]) + 1
            message.delivery_timestamp_ms = 0
            await self._to_dlq(ck.group, [message])
            self.dead_lettered += 1
            if ck.states[index] == EntryState.PENDING:  # claimed: nothing settled it meanwhile
                self._ledger.revived(ck, index)
        finally:
            self._ledger.forwarding.discard((ck.ck_id, index))
            self._ledger.flush_commits()
            self._journal.flush()
            if ck.fifo:  # settled either way (moved, or gone: MESSAGE_NOT_FOUND): unblocked
                state = self._ledger.existing_queue(*ck.queue_key)
                if state is not None and not state.inflight:
                    self._hold.wake(ck.topic, ck.group, ck.queue_id)
