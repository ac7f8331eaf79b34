"""The Broker: one store plus the POP engine, the timer, revive and the hold table.

``Broker`` structurally satisfies ``broker.contract.port.BrokerPort``. ``start()`` opens the store
(which recovers it), recovers the pop journal and the timer, and starts the background tasks
the broker owns: revive, timer delivery, and checkpoint spill / journal maintenance (the store
runs its own flush and retention task). ``stop()`` cancels them, journals what is still in
flight, and closes everything.

Durability window, in words: a message is never lost once ``send`` returns (subject to the
store's flush mode). A popped message whose checkpoint was not yet journaled (younger than
``pop.checkpoint_buffer_ms``) is redelivered after a crash, as are messages acked after the
last consumer-offset flush (``store.flush_interval_ms``) when an older message of the same
queue was still in flight: consumption is at least once. An ack whose consumer offset was
flushed is never redelivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import replace

import anyio
from popmq.broker.auto_create import AutoCreateGate
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.message_types import (
    MessageType,
    check_fits,
    message_kind,
    parse_message_type,
)
from popmq.broker.contract.queues import queue_for_group
from popmq.broker.contract.types import (
    PROP_TRANSACTION,
    SYSTEM_PREFIX,
    AckEntry,
    AckEntryResult,
    ChangeInvisibleResult,
    GroupConfig,
    GroupDeleted,
    GroupQueueStats,
    GroupSummary,
    HalfMessageInfo,
    Message,
    NotifyRequest,
    NotifyResult,
    PopRequest,
    PopResult,
    PullRequest,
    PullResult,
    PullStatus,
    QueueInfo,
    SendResult,
    StoredMessage,
    TopicInfo,
    TransactionCheck,
    legacy_retry_topic,
    retry_topic,
)
from popmq.broker.isolation import FailureTracker
from popmq.broker.metered_hold import MeteredHoldTable
from popmq.broker.metrics import BrokerMetrics, message_type, take_snapshot
from popmq.broker.pop.engine import PopEngine
from popmq.broker.pop.groups import GroupRegistry
from popmq.broker.pop.hold import HoldOutcome, HoldTable
from popmq.broker.pop.journal import PopJournal
from popmq.broker.pop.ledger import CheckpointLedger
from popmq.broker.pop.names import check_group, check_topic, is_system_topic
from popmq.broker.pop.revive import ReviveService
from popmq.broker.pop.selection import RoundRobin
from popmq.broker.recall_handle import RecallTicket, open_recall, seal_recall
from popmq.broker.store import MessageStore, TopicMeta
from popmq.broker.store.damage import MetadataFallback, Quarantine
from popmq.broker.timer import TimerService
from popmq.broker.transaction_id import (
    TransactionTicket,
    open_transaction,
    seal_transaction,
)
from popmq.broker.transactions import TransactionService

from popmq.clock import SYSTEM, Clock
from popmq.config import BrokerConfig
from popmq.lifecycle import TaskOwner
from popmq.tracing import link_to, tracer

log = logging.getLogger(__name__)

SYSTEM_QUEUE_COUNT = 1  # retry, DLQ and timer topics have one queue (as in RocketMQ)
_MAX_PULL_BATCH = 1024
_IDLE_WAIT_S = 1.0


class Broker:
    def __init__(self, config: BrokerConfig, clock: Clock = SYSTEM) -> None:
        self._config = config
        # Time comes from one injected Clock: tests run the broker on virtual time.
        self._time = clock
        self._clock: Callable[[], int] = clock.now_ms
        self._store = MessageStore(
            config.data_dir, config.name, config.store, self._clock, timer=clock
        )
        self._metrics = BrokerMetrics(config.name, cluster=config.cluster)
        self._metrics_state = self._metrics.watch(lambda: take_snapshot(self, self._clock))
        self._hold = MeteredHoldTable(
            config.polling.max_held_per_key, config.polling.max_held_total, self._metrics
        )
        self._groups = GroupRegistry(
            self._store, config.pop, config.groups, self._metrics.auto_create_refused
        )
        topics = config.topics
        self._topic_gate = AutoCreateGate(
            "topic", topics.auto_create, topics.max_auto_created, topics.auto_create_per_second,
            self._metrics.auto_create_refused,
        )  # fmt: skip
        self._round_robin = RoundRobin()
        # The background loops (revive, timer, pop journal): cancelled at once on stop.
        self._tasks = TaskOwner(f"broker:{config.name}", grace_s=0)
        self._started = False
        self._stopping = False  # aclose() began: refusals say "retry elsewhere"
        self._journal: PopJournal | None = None
        self._ledger: CheckpointLedger | None = None
        self._engine: PopEngine | None = None
        self._revive: ReviveService | None = None
        self._timer = TimerService(self._store, self._clock, self._ensure_destination)
        self._timer.failures = self._failure_tracker()
        tx = config.transaction
        self._transactions = TransactionService(
            self._store, self._clock, self._ensure_destination,
            tx.check_immunity_ms, tx.check_interval_ms, tx.max_checks,
        )  # fmt: skip

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._config.name

    @property
    def config(self) -> BrokerConfig:
        return self._config

    @property
    def started(self) -> bool:
        return self._started

    @property
    def metrics(self) -> BrokerMetrics:
        return self._metrics

    @property
    def store(self) -> MessageStore:
        return self._store

    @property
    def hold_table(self) -> HoldTable:
        return self._hold

    @property
    def engine(self) -> PopEngine:
        if self._engine is None:
            raise RefusedError(Code.INTERNAL_ERROR, f"broker {self.name} is not started")
        return self._engine

    @property
    def ledger(self) -> CheckpointLedger:
        if self._ledger is None:
            raise RefusedError(Code.INTERNAL_ERROR, f"broker {self.name} is not started")
        return self._ledger

    @property
    def revive_service(self) -> ReviveService:
        if self._revive is None:
            raise RefusedError(Code.INTERNAL_ERROR, f"broker {self.name} is not started")
        return self._revive

    @property
    def timer(self) -> TimerService:
        return self._timer

    @property
    def transactions(self) -> TransactionService:
        return self._transactions

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self, *, open_off_loop: bool = False) -> None:
        """Open the store (recovery), then the POP state, and start the background loops.
        ``open_off_loop``: the store's open and recovery walk run on a worker thread, so the
        event loop goes on serving what else it carries (a promoted node's lease keepalives
        and etcd watches) meanwhile; nothing else touches the store until it is open."""
        if self._started:
            return
        self._stopping = False
        if open_off_loop:
            # Not abandoned if cancelled: the open runs to its end (a cancellation lands at
            # the caller's next checkpoint, with the broker started, for it to close).
            await anyio.to_thread.run_sync(self._store.open)
        else:
            self._store.open()
        try:
            self._open_pop_state()
        except BaseException:
            await self._store.aclose()
            raise
        self._store.add_arrival_listener(self._on_arrival)
        self._hold.reopen()
        await self._store.start()
        self._tasks = TaskOwner(f"broker:{self.name}", grace_s=0)
        self._tasks.spawn(self._supervise("revive", self._revive_step), "revive")
        self._tasks.spawn(self._supervise("timer", self._timer_step), "timer")
        self._tasks.spawn(self._supervise("pop-journal", self._journal_step), "pop-journal")
        self._tasks.spawn(self._supervise("transactions", self._transaction_step), "transactions")
        self._started = True
        self._metrics_state.loop = asyncio.get_running_loop()
        log.info("broker %s started on %s", self.name, self._config.data_dir)

    def _open_pop_state(self) -> None:
        self._groups.load()
        journal_path = self._store.data_dir / "pop" / "journal.log"
        if not journal_path.exists() and not self._store.was_new:
            # Checkpoints of messages in flight are gone: they are delivered again early.
            log.error("broker %s: the pop journal %s is missing; messages in flight may be "
                      "delivered again before their invisible time ends", self.name,
                      journal_path)  # fmt: skip
            self._store.faults.metadata.append(
                MetadataFallback("pop/journal.log", "reset", "missing")
            )
        journal = PopJournal(journal_path, Quarantine(self._store.data_dir))
        ledger = CheckpointLedger(
            journal,
            self._start_offset,
            self._commit_offset,
            first_id=self._clock() * 1000,
        )
        recovered = journal.load()
        faults = self._store.faults
        self._metrics.store_faults([*faults.damage, *journal.faults], faults.metadata)
        live = ledger.recover(recovered)
        ledger.flush_commits()
        journal.rewrite(ledger.journaled(self._durable_offset))
        pending_timers = self._timer.recover()
        halves = self._transactions.recover()
        if recovered or pending_timers or halves:
            log.info(
                "broker %s recovered %d in-flight checkpoints, %d delayed messages, "
                "%d undecided transactional messages",
                self.name,
                live,
                pending_timers,
                halves,
            )
        self._journal = journal
        self._ledger = ledger
        self._engine = PopEngine(
            name=self.name,
            config=self._config,
            store=self._store,
            ledger=ledger,
            journal=journal,
            hold=self._hold,
            groups=self._groups,
            clock=self._clock,
            time=self._time,
        )
        self._revive = ReviveService(
            store=self._store,
            ledger=ledger,
            journal=journal,
            hold=self._hold,
            groups=self._groups,
            timer=self._timer,
            append_system=self._append_system,
            clock=self._clock,
        )
        self._revive.failures = self._failure_tracker()

    def journal_in_flight(self) -> None:
        """Journal every checkpoint in flight now, not after ``checkpoint_buffer_ms``: with
        replication a pop's handle and its acks must reach the followers (the journal is
        what they copy)."""
        if self._ledger is not None and self._journal is not None:
            self._ledger.spill(self._clock(), buffer_ms=-(1 << 62))
            self._journal.flush()

    async def aclose(self) -> None:
        """Stop: held pops answer, the background loops end, state is made durable."""
        if not self._started:
            return
        self._started = False
        self._stopping = True
        self._hold.close()  # held long polls answer now (with what is there)
        await self._tasks.aclose()
        self._store.remove_arrival_listener(self._on_arrival)
        try:
            if self._ledger is not None and self._journal is not None:
                # Everything still in flight becomes durable: after a restart it revives at
                # its invisible time instead of being handed out again at once.
                self._ledger.spill(self._clock(), buffer_ms=-(1 << 62))
                self._ledger.flush_commits()
                self._journal.close()
            self._groups.close()
        finally:
            # A checkpoint first waits out one the store's own flush task may be running, so
            # close() does not cancel that one half-way through its file writes.
            with contextlib.suppress(Exception):
                await self._store.checkpoint()
            await self._store.aclose()
        log.info("broker %s stopped", self.name)

    async def _supervise(self, name: str, step: Callable[[], Awaitable[float]]) -> None:
        """Run one background job forever; a failing step is logged and retried."""
        while True:
            try:
                delay = await step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("broker %s: %s task failed; retrying", self.name, name)
                delay = 0.5
            await self._time.sleep(delay)

    def _sleep_until(self, due_ms: int | None, cap_ms: int) -> float:
        if due_ms is None:
            return cap_ms / 1000
        return min(max(due_ms - self._clock(), 1), cap_ms) / 1000

    async def _revive_step(self) -> float:
        await self.revive_service.revive_due()
        return self._sleep_until(
            self.ledger.next_due_ms(), self._config.pop.revive_scan_interval_ms
        )

    async def _timer_step(self) -> float:
        self._metrics.timer_delivered(await self._timer.deliver_due())
        return self._sleep_until(
            self._timer.next_due_ms(), self._config.pop.revive_scan_interval_ms
        )

    async def _transaction_step(self) -> float:
        self._metrics.transaction_checks(0, await self._transactions.park_abandoned())
        return self._transactions.check_interval_ms / 1000

    async def _journal_step(self) -> float:
        """Spill checkpoints older than the buffer time; fsync and compact the journal."""
        journal, ledger = self._journal, self.ledger
        assert journal is not None
        self._metrics.spilled(ledger.spill(self._clock(), self._config.pop.checkpoint_buffer_ms))
        ledger.flush_commits()
        await journal.sync()
        if journal.should_compact():
            journal.rewrite(ledger.journaled(self._durable_offset))
        interval = min(self._config.pop.checkpoint_buffer_ms, self._config.store.flush_interval_ms)
        return max(interval, 10) / 1000

    # -- store hooks ----------------------------------------------------------------------
    def _durable_offset(self, queue_key: tuple[str, str, int]) -> int:
        return self._store.durable_consumer_offset(*queue_key)

    def _on_arrival(self, topic: str, queue_id: int, max_offset: int, tags: set[str]) -> None:
        self._hold.on_arrival(topic, queue_id, max_offset, tags)

    def _start_offset(self, group: str, topic: str, queue_id: int) -> int:
        """Where a group starts on a queue: its committed offset, else the queue's start."""
        try:
            committed = self._store.get_consumer_offset(group, topic, queue_id)
            low = self._store.min_offset(topic, queue_id)
            high = self._store.max_offset(topic, queue_id)
        except RefusedError:  # the topic or queue is gone (deleted while messages were out)
            return 0
        # An offset past the end means the store lost its tail (machine crash, async flush).
        return low if committed < 0 else min(max(committed, low), high)

    def _commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with contextlib.suppress(RefusedError):  # the topic may have been deleted meanwhile
            self._store.set_consumer_offset(group, topic, queue_id, offset)

    def _failure_tracker(self) -> FailureTracker[int]:
        pop = self._config.pop
        return FailureTracker(
            max_attempts=pop.park_after_attempts,
            base_backoff_ms=pop.loop_backoff_ms,
            max_backoff_ms=max(pop.loop_backoff_max_ms, pop.loop_backoff_ms),
        )

    def _ensure_destination(self, topic: str) -> bool:
        if self._store.get_topic(topic) is not None:
            return True
        if is_system_topic(topic):
            self._store.create_topic(topic, SYSTEM_QUEUE_COUNT)
            return True
        return False

    async def _append_system(
        self, topic: str, queue_id: int, messages: list[Message]
    ) -> list[StoredMessage]:
        self._ensure_destination(topic)
        return await self._store.append(topic, queue_id, messages)

    def _require_started(self) -> None:
        if self._started:
            return
        if self._stopping:
            # Shutting down (a rolling restart, a leader stepping down): the same request
            # succeeds on another broker or on this one's successor, so the code is one a
            # proxy and a client retry (as a group without a leader answers), not an error.
            raise RefusedError(Code.HA_NOT_AVAILABLE,
                               f"broker {self.name} is stopping: retry the request")  # fmt: skip
        raise RefusedError(Code.INTERNAL_ERROR, f"broker {self.name} is not started")

    # -- produce --------------------------------------------------------------------------
    def _topic_for_send(self, message: Message, kind: MessageType) -> TopicMeta:
        """The message's topic (created on first use), refusing a message whose type (`kind`)
        does not fit it (MESSAGE_PROPERTY_CONFLICT_WITH_TYPE). A topic still without a type
        (made by a route lookup) takes this first message's type."""
        meta = self._store.get_topic(message.topic)
        if meta is None:
            return self._auto_create_topic(message.topic, kind)
        if meta.message_type is MessageType.UNSPECIFIED:
            meta = self._store.set_topic_type(message.topic, kind)
            log.info("topic %s takes %s messages (its first message's type)", meta.name, kind.value)
        check_fits(meta.name, meta.message_type, kind)
        return meta

    def _auto_create_topic(self, topic: str, first: MessageType | None = None) -> TopicMeta:
        """Create a topic on first use, within broker.topics' auto-creation limits. Its type
        is its first message's (UNSPECIFIED until one comes), or MIXED if so configured."""
        check_topic(topic)
        user_topics = sum(1 for meta in self._store.list_topics()
                          if not meta.name.startswith(SYSTEM_PREFIX))  # fmt: skip
        self._topic_gate.admit(topic, user_topics)
        kind = first or MessageType.UNSPECIFIED
        if self._config.topics.auto_create_message_type == "MIXED":
            kind = MessageType.MIXED
        return self._store.create_topic(topic, self._config.topics.queue_count, kind)

    def _check_message(self, message: Message) -> None:
        check_topic(message.topic)
        if not message.body:
            raise RefusedError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
        limit = self._config.store.max_body_bytes
        if len(message.body) > limit:
            raise RefusedError(
                Code.MESSAGE_BODY_TOO_LARGE,
                f"message body is {len(message.body)} bytes; the limit is {limit}",
            )
        if "|" in message.tag or (message.tag and not message.tag.strip()):
            raise RefusedError(Code.ILLEGAL_MESSAGE_TAG, f"illegal tag {message.tag!r}")

    async def send(self, messages: list[Message], queue_id: int = -1) -> list[SendResult]:
        self._require_started()
        if not messages:
            raise RefusedError(Code.BAD_REQUEST, "nothing to send")
        now = self._clock()
        immediate: dict[tuple[str, int], list[tuple[int, Message]]] = defaultdict(list)
        delayed: list[tuple[int, Message, str, int]] = []
        halves: list[tuple[int, Message, str, int]] = []
        batch_queue: dict[str, int] = {}  # one round-robin queue per topic per call
        arrivals: dict[tuple[str, str], list[int]] = defaultdict(list)  # RocketMQ's metrics
        for message in messages:
            self._check_message(message)
        topics: dict[tuple[str, MessageType], TopicMeta] = {}  # a batch shares its topic
        for position, message in enumerate(messages):
            kind = message_kind(message.message_group, message.delivery_timestamp_ms,
                                PROP_TRANSACTION in message.properties)  # fmt: skip
            meta = topics.get((message.topic, kind))
            if meta is None:
                meta = topics[message.topic, kind] = self._topic_for_send(message, kind)
            if queue_id >= 0:
                if queue_id >= meta.queue_count:
                    raise RefusedError(
                        Code.BAD_REQUEST,
                        f"queue {queue_id} is not a queue of {meta.name!r} "
                        f"(0..{meta.queue_count - 1})",
                    )
                target = queue_id
            elif message.message_group:
                target = queue_for_group(message.message_group, meta.queue_count)
            else:
                target = batch_queue.get(meta.name, -1)
                if target < 0:
                    target = self._round_robin.next(meta.name, meta.queue_count)
                    batch_queue[meta.name] = target
            if not message.born_timestamp_ms:
                message = replace(message, born_timestamp_ms=now)
            arrivals[meta.name, message_type(message)].append(len(message.body))
            if PROP_TRANSACTION in message.properties:
                halves.append((position, message, meta.name, target))
            elif message.delivery_timestamp_ms > now:
                delayed.append((position, message, meta.name, target))
            else:
                immediate[(meta.name, target)].append((position, message))
        results: list[SendResult | None] = [None] * len(messages)
        for (topic, target), items in immediate.items():
            ids, base = await self._store.append_ids(topic, target, [m for _, m in items])
            self._metrics.stored(topic, len(ids))
            for offset, ((position, _), message_id) in enumerate(zip(items, ids, strict=True)):
                results[position] = SendResult(message_id, topic, target, base + offset, self.name)
        if delayed:
            records = await self._timer.schedule([(m, t, q) for _, m, t, q in delayed])
            delayed_per_topic: dict[str, int] = defaultdict(int)
            for _, _, topic, _ in delayed:
                delayed_per_topic[topic] += 1
            for topic, count in delayed_per_topic.items():
                self._metrics.stored(topic, count)
            for (position, _, topic, target), record in zip(delayed, records, strict=True):
                # The queue offset is only known once the message is delivered.
                ticket = RecallTicket(self.name, topic, record.queue_offset, record.message_id,
                                      record.delivery_timestamp_ms)  # fmt: skip
                handle = seal_recall(self.engine.keyring, ticket)
                results[position] = SendResult(
                    record.message_id, topic, target, -1, self.name, handle
                )
        if halves:
            records = await self._transactions.prepare([(m, t, q) for _, m, t, q in halves])
            self._metrics.transactions_prepared(len(records))
            for (position, _, topic, target), record in zip(halves, records, strict=True):
                tx_ticket = TransactionTicket(self.name, topic, record.queue_offset,
                                              record.message_id)  # fmt: skip
                results[position] = SendResult(
                    record.message_id, topic, target, -1, self.name,
                    transaction_id=seal_transaction(self.engine.keyring, tx_ticket),
                )  # fmt: skip
        self._metrics.received(arrivals)
        return [result for result in results if result is not None]

    # -- transactions ---------------------------------------------------------------------
    async def end_transaction(
        self, topic: str, message_id: str, transaction_id: str, commit: bool, source: str = ""
    ) -> None:
        """EndTransaction: COMMIT writes the half message into its topic, ROLLBACK drops it."""
        self._require_started()
        check_topic(topic)
        ticket = open_transaction(self.engine.keyring, transaction_id)
        if ticket.broker != self.name or ticket.topic != topic or ticket.message_id != message_id:
            raise RefusedError(
                Code.INVALID_TRANSACTION_ID,
                f"the transaction id is not for message {message_id} of topic {topic!r} here",
            )
        # The decision's span is in its caller's trace, linked to the half send's span.
        link = link_to(self._transactions.trace_of(ticket.half_offset))
        name = "popmq.transaction.commit" if commit else "popmq.transaction.rollback"
        with tracer().start_as_current_span(
            name, links=[link] if link is not None else None,
            attributes={"messaging.message.id": message_id, "messaging.destination.name": topic,
                        "popmq.transaction.source": source or "CLIENT"},
        ) as span:  # fmt: skip
            decided = await self._transactions.end(ticket.half_offset, message_id, topic, commit)
            if span.is_recording():
                span.set_attribute("popmq.transaction.repeat", not decided)
        if decided:
            self._metrics.transaction_ended(commit, source, topic)
            if commit:
                self._metrics.stored(topic, 1)
            # A producer's own decision is the normal path (one per message: DEBUG); one a
            # check-back or an operator took is worth a line.
            level = logging.DEBUG if source in ("", "CLIENT") else logging.INFO
            log.log(level, "transaction of message %s (%s) %s by %s", message_id, topic,
                    "committed" if commit else "rolled back", source or "CLIENT")  # fmt: skip

    async def claim_transaction_checks(
        self, topics: list[str], limit: int = 64
    ) -> list[TransactionCheck]:
        self._require_started()
        parked = self._transactions.parked
        claimed = await self._transactions.claim_checks(set(topics), limit)
        self._metrics.transaction_checks(len(claimed), self._transactions.parked - parked)
        return [
            TransactionCheck(due.message, self._seal(due.message, due.half_offset), due.checks)
            for due in claimed
        ]

    async def list_transactions(self) -> list[HalfMessageInfo]:
        self._require_started()
        found: list[HalfMessageInfo] = []
        for half in self._transactions.halves():
            ticket = TransactionTicket(self.name, half.topic, half.offset, half.message_id)
            found.append(HalfMessageInfo(
                half.topic, half.message_id, seal_transaction(self.engine.keyring, ticket),
                half.stored_ms, half.checks, half.parked,
            ))  # fmt: skip
        return found

    def _seal(self, message: StoredMessage, half_offset: int) -> str:
        ticket = TransactionTicket(self.name, message.topic, half_offset, message.message_id)
        return seal_transaction(self.engine.keyring, ticket)

    async def recall(self, topic: str, recall_handle: str) -> str:
        """Cancel a delay message that has not been delivered yet (RecallMessage); returns
        its message id. BAD_REQUEST for a handle that is forged, another broker's, or for
        another topic; NOT_FOUND once the message was delivered."""
        self._require_started()
        check_topic(topic)
        ticket = open_recall(self.engine.keyring, recall_handle)
        if ticket.broker != self.name or ticket.topic != topic:
            raise RefusedError(
                Code.BAD_REQUEST, f"invalid recall handle: it is not for topic {topic!r} here"
            )
        recalls = self._timer.recalls
        await self._timer.recall(ticket.timer_offset, ticket.message_id)
        if self._timer.recalls > recalls:  # not a repeated recall of the same message
            self._metrics.recalled()
            # Once per message: a replayed handle is answered, not logged again.
            log.info("recalled delay message %s of %s (due at %d)", ticket.message_id, topic,
                     ticket.due_ms)  # fmt: skip
        return ticket.message_id

    # -- POP consumption ------------------------------------------------------------------
    async def pop(self, request: PopRequest) -> PopResult:
        self._require_started()
        result = await self.engine.pop(request)
        self._metrics.popped(result.status, result.messages, request.group, request.topic)
        return result

    async def ack(self, group: str, topic: str, entries: list[AckEntry]) -> list[AckEntryResult]:
        self._require_started()
        results = await self.engine.ack(group, topic, entries)
        self._metrics.acked(result.code for result in results)
        return results

    async def change_invisible_time(
        self, group: str, topic: str, receipt_handle: str, invisible_time_ms: int
    ) -> ChangeInvisibleResult:
        self._require_started()
        result = await self.engine.change_invisible_time(
            group, topic, receipt_handle, invisible_time_ms
        )
        self._metrics.invisible_changed()
        return result

    async def hand_back(self, group: str, topic: str, receipt_handles: list[str]) -> int:
        self._require_started()
        return self.engine.hand_back(group, topic, receipt_handles)

    async def notify(self, request: NotifyRequest) -> NotifyResult:
        self._require_started()
        return await self.engine.notify(request)

    async def forward_to_dlq(self, group: str, topic: str, receipt_handle: str) -> None:
        self._require_started()
        ck, index = self.engine.take_for_dlq(group, topic, receipt_handle)
        await self.revive_service.forward_to_dlq(ck, index)

    # -- offset-based consumption ---------------------------------------------------------
    def _existing_topic(self, topic: str) -> TopicMeta:
        check_topic(topic, user=False)
        meta = self._store.get_topic(topic)
        if meta is None:
            raise RefusedError(Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        return meta

    def _existing_queue(self, topic: str, queue_id: int) -> TopicMeta:
        meta = self._existing_topic(topic)
        if not 0 <= queue_id < meta.queue_count:
            raise RefusedError(
                Code.BAD_REQUEST,
                f"queue {queue_id} is not a queue of {topic!r} (0..{meta.queue_count - 1})",
            )
        return meta

    async def pull(self, request: PullRequest) -> PullResult:
        self._require_started()
        topic, queue_id = request.topic, request.queue_id
        self._existing_queue(topic, queue_id)
        if not 1 <= request.max_messages <= _MAX_PULL_BATCH:
            raise RefusedError(
                Code.BAD_REQUEST, f"pull batch must be within [1, {_MAX_PULL_BATCH}]"
            )
        if request.poll_time_ms < 0:
            raise RefusedError(Code.ILLEGAL_POLLING_TIME, "poll time must not be negative")
        request.filter.check()
        tags = request.filter.tags()
        select = request.filter.selects()  # SQL92: applied to what the read returns
        deadline = self._clock() + request.poll_time_ms
        offset = request.offset
        while True:
            low = self._store.min_offset(topic, queue_id)
            high = self._store.max_offset(topic, queue_id)
            if offset < low:
                return PullResult(PullStatus.OFFSET_PURGED, [], low, low, high)
            if offset > high:
                return PullResult(PullStatus.OFFSET_ILLEGAL, [], high, low, high)
            if offset < high:
                result = self._store.read(topic, queue_id, offset, request.max_messages, tags)
                messages = result.messages
                if select is not None:
                    messages = [m for m in messages if select(m)]
                if messages:
                    return PullResult(PullStatus.FOUND, messages, result.next_offset,
                                      low, high)  # fmt: skip
                if result.next_offset > offset:
                    offset = result.next_offset  # only filtered-out messages so far
                    if select is not None:
                        await asyncio.sleep(0)  # decoding a long unmatched run: let others in
                    continue
            remaining = deadline - self._clock()
            if remaining <= 0:
                return PullResult(PullStatus.NO_NEW_MESSAGE, [], offset, low, high)
            outcome = await self._hold.wait(
                [(topic, "", queue_id)], remaining, tags, min_offset=offset
            )
            if outcome is HoldOutcome.FULL:
                return PullResult(PullStatus.POLLING_FULL, [], offset, low, high)
            if outcome is HoldOutcome.TIMEOUT:
                deadline = 0  # one last read, then answer

    async def get_consumer_offset(self, group: str, topic: str, queue_id: int) -> int:
        self._require_started()
        check_group(group)
        self._existing_queue(topic, queue_id)
        return self._store.get_consumer_offset(group, topic, queue_id)

    async def update_consumer_offset(
        self, group: str, topic: str, queue_id: int, offset: int
    ) -> None:
        self._require_started()
        check_group(group)
        self._existing_queue(topic, queue_id)
        high = self._store.max_offset(topic, queue_id)
        if not 0 <= offset <= high:
            raise RefusedError(
                Code.ILLEGAL_OFFSET, f"offset {offset} is outside 0..{high} of {topic}/{queue_id}"
            )
        self._store.set_consumer_offset(group, topic, queue_id, offset)
        # POP progress of the group restarts there (in-flight messages still revive).
        self.ledger.reset_queue(group, topic, queue_id)
        # What the reset made visible again is news to held pops and watches (no arrival).
        self._hold.wake(topic, group, queue_id)

    async def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        self._require_started()
        self._existing_queue(topic, queue_id)
        return self._store.offset_for_timestamp(topic, queue_id, timestamp_ms)

    # -- administration -------------------------------------------------------------------
    def _topic_info(self, meta: TopicMeta) -> TopicInfo:
        queues = [
            QueueInfo(q, self._store.min_offset(meta.name, q), self._store.max_offset(meta.name, q))
            for q in range(meta.queue_count)
        ]
        return TopicInfo(meta.name, meta.queue_count, queues, meta.message_type.value)

    async def create_topic(self, topic: str, queue_count: int, message_type: str = "") -> TopicInfo:
        """Create a topic (MIXED unless ``message_type`` says otherwise), or grow it; a
        ``message_type`` given for an existing topic changes its type (mqadmin updateTopic)."""
        self._require_started()
        check_topic(topic)
        if not 1 <= queue_count <= 1024:
            raise RefusedError(Code.BAD_REQUEST, "queue count must be within [1, 1024]")
        kind = parse_message_type(message_type) if message_type else None
        if kind is MessageType.UNSPECIFIED:
            raise RefusedError(Code.BAD_REQUEST, "a topic cannot be created as UNSPECIFIED")
        meta = self._store.create_topic(topic, queue_count, kind)
        if kind is not None and meta.message_type is not kind:
            meta = self._store.set_topic_type(topic, kind)
        return self._topic_info(meta)

    async def get_topic(self, topic: str, auto_create: bool = False) -> TopicInfo:
        self._require_started()
        check_topic(topic, user=False)
        meta = self._store.get_topic(topic)
        if meta is None:
            if not auto_create or is_system_topic(topic):
                raise RefusedError(Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
            meta = self._auto_create_topic(topic)
        return self._topic_info(meta)

    async def list_topics(self) -> list[TopicInfo]:
        self._require_started()
        return [
            self._topic_info(meta)
            for meta in self._store.list_topics()
            if not meta.name.startswith(SYSTEM_PREFIX)
        ]

    async def delete_topic(self, topic: str) -> None:
        self._require_started()
        check_topic(topic, user=False)
        self._existing_topic(topic)
        self._store.delete_topic(topic)
        self.ledger.forget_topic(topic)

    async def get_group(self, group: str) -> GroupConfig:
        self._require_started()
        return replace(self._groups.get(group))

    async def update_group(self, config: GroupConfig) -> GroupConfig:
        self._require_started()
        return replace(self._groups.update(config))

    async def list_groups(self) -> list[GroupSummary]:
        self._require_started()
        offsets: dict[str, int] = {}
        for group, _, _ in self._store.consumer_offset_keys():
            offsets[group] = offsets.get(group, 0) + 1
        return [
            GroupSummary(replace(c), self.ledger.group_inflight(c.name), offsets.get(c.name, 0))
            for c in self._groups.configs()
        ]

    async def delete_group(
        self, group: str, clean_offsets: bool = False, force: bool = False
    ) -> GroupDeleted:
        """Delete a group's settings (mqadmin deleteSubGroup). Refused with
        PRECONDITION_FAILED while messages are in flight, unless ``force``: those then revive
        to %RETRY% as usual (nothing is dropped). ``clean_offsets`` also removes its committed
        offsets (RocketMQ's cleanOffset). Retry and DLQ topics are kept."""
        self._require_started()
        check_group(group)
        inflight = self.ledger.group_inflight(group)
        if inflight and not force:
            raise RefusedError(
                Code.PRECONDITION_FAILED,
                f"group {group!r} has {inflight} messages in flight on broker {self.name}; "
                "ack them, wait for their invisible time, or delete with force",
            )
        self._groups.delete(group)
        removed = 0
        if clean_offsets:
            removed = self._store.delete_consumer_offsets(group)
            self.ledger.forget_group(group)
        log.info("broker %s deleted group %s (%d in flight, %d offsets removed)", self.name,
                 group, inflight, removed)  # fmt: skip
        return GroupDeleted(inflight, removed)

    async def group_stats(self, group: str, topic: str) -> list[GroupQueueStats]:
        return self.group_stats_now(group, topic)

    def group_stats_now(self, group: str, topic: str) -> list[GroupQueueStats]:
        """group_stats without a coroutine (for the metrics read at scrape time)."""
        self._require_started()
        check_group(group)
        stats: list[GroupQueueStats] = []
        for name in (topic, retry_topic(group, topic), legacy_retry_topic(group, topic)):
            meta = self._existing_topic(topic) if name == topic else self._store.get_topic(name)
            if meta is None:
                continue
            for queue_id in range(meta.queue_count):
                state = self.ledger.existing_queue(group, name, queue_id)
                committed = (
                    state.committed if state is not None
                    else self._start_offset(group, name, queue_id)
                )  # fmt: skip
                stats.append(
                    GroupQueueStats(
                        name,
                        queue_id,
                        committed,
                        self._store.max_offset(name, queue_id),
                        len(state.inflight) if state is not None else 0,
                    )
                )
        return stats
