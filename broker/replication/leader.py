"""The leader's side: one sender per connected follower, the in-sync set, the sync barrier.

Each follower's stream: take a snapshot of what changed (files.py), send it as one batch,
and again once the follower acknowledged it (``_Session.WINDOW``, 1: a group commit, as a
database's log flush: whatever was written while a batch travelled and was fsynced goes in the
next one, so under load batches grow instead of multiplying; each batch costs both sides a
fixed amount of CPU, which on a busy machine is latency for every write). Once caught up, a
sender takes its next snapshot when a write waits on the barrier, else every ``poll_ms`` (what
the broker writes by itself, such as revivals); an empty snapshot is sent only when a write
waits for a batch, or as a heartbeat every ``heartbeat_s`` (it keeps the follower's catch-up
time fresh).

The sync barrier (``replicated``): a write that returned locally waits until every follower of
the in-sync set (and at least ``min_in_sync - 1`` of them) acknowledged a complete snapshot
that holds the write, as RocketMQ's allAckInSyncStateSet. Which snapshots hold it is told by
the change marks (store/changes.py), which every writer of a replicated file moves after its
write: the write's *ticket* is the newest mark when it asks (``changes.newest``), a complete
snapshot's is the newest mark it read before looking, and a snapshot whose ticket is at least
the write's saw all of it. So a write whose bytes went out in the batch already in flight (a
snapshot taken while it waited for its local fsync, for another write) is answered by that
batch's acknowledgement instead of waiting for one more, empty, round trip. Before a send is
written at all, ``check_available`` refuses it (HA_NOT_AVAILABLE) when fewer than
``min_in_sync`` nodes are in sync, so nothing is written that could be acknowledged and then
lost.

In-sync changes are reported through the role source before a member stops being waited for
(a shrink), and after a new member is waited for (a growth): the recorded set never lacks a
node that acknowledged writes the others may not have.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import grpc
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.replication import epochs
from popmq.broker.replication.files import (
    DataSnapshotter,
    FollowerBehindRetention,
    Snapshot,
    list_segments,
    log_end,
)
from popmq.broker.replication.in_sync import Change, InSyncSet
from popmq.broker.replication.role import GroupRole, RoleSource
from popmq.broker.store import changes

from popmq.clock import SYSTEM, Clock
from popmq.config import ReplicationConfig
from popmq.lifecycle import TaskOwner
from popmq.pb.replication.v1 import replication_pb2 as pb
from popmq.pb.replication.v1 import replication_pb2_grpc

log = logging.getLogger(__name__)

_EVALUATE_EVERY_S = 0.5


@dataclass(frozen=True, slots=True)
class FollowerStatus:
    name: str
    connected: bool
    in_sync: bool
    lag_bytes: int  # commitlog bytes it has not acknowledged
    lag_s: float | None  # seconds since it last caught up (None: never)


class ReplicationLeader(replication_pb2_grpc.ReplicationServiceServicer):
    def __init__(
        self,
        data_dir: Path,
        node: str,
        role: GroupRole,
        roles: RoleSource,
        config: ReplicationConfig,
        history: epochs.EpochHistory,
        *,
        clock: Clock = SYSTEM,
        copy_keyring: bool = True,
    ) -> None:
        self._dir = Path(data_dir)
        self._node = node
        self._role = role
        self._roles = roles
        self._config = config
        self._history = history
        self._clock = clock
        self._copy_keyring = copy_keyring
        self.in_sync = InSyncSet(node, config.max_lag_s, clock.monotonic)
        # Writes waiting on the barrier, oldest first: their targets and deadlines only grow.
        self._waiters: deque[_Waiter] = deque()
        self._waiter_added = asyncio.Event()
        self._kicks: set[asyncio.Event] = set()  # one per sender
        self._sessions: dict[str, int] = {}  # node -> stream generation
        self._tasks = TaskOwner(f"replication-leader:{node}", grace_s=0)
        self._closed = False
        self._reported: frozenset[str] | None = None
        self._evaluating = asyncio.Lock()  # one evaluation (and its reports) at a time

    async def __aenter__(self) -> ReplicationLeader:
        self._tasks.spawn(self._watch_in_sync(), "in-sync")
        self._tasks.spawn(self._expire_waiters(), "barrier-timeouts")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        await self._tasks.aclose()
        self._settle()

    # -- the barrier -------------------------------------------------------------------------
    @property
    def min_in_sync(self) -> int:
        return self._config.min_in_sync

    def leads(self) -> bool:
        """Whether this node may answer as the leader now: not closed, and not fenced by its
        role source (a leader whose lease deadline passed answers nothing, reads included,
        until a keepalive renews it; a successor may exist)."""
        return not self._closed and self._roles.current().is_leader

    def check_available(self) -> None:
        """Refuse a write now when this node may no longer lead (its role source fenced it)
        or fewer than min_in_sync nodes are in sync."""
        if not self._roles.current().is_leader:
            raise RefusedError(Code.HA_NOT_AVAILABLE, "this node no longer leads; nothing was "
                               "written")  # fmt: skip
        if self.in_sync.size < self.min_in_sync:
            raise RefusedError(
                Code.HA_NOT_AVAILABLE,
                f"only {self.in_sync.size} of the {self.min_in_sync} nodes replication needs "
                f"are in sync ({', '.join(sorted(self.members))}); nothing was written",
            )

    @property
    def members(self) -> frozenset[str]:
        """The in-sync set, this leader included."""
        return self.in_sync.with_change(Change(frozenset(), frozenset()))

    async def replicated(self) -> None:
        """Return once what was written before this call is durable on the in-sync set
        (sync), or at once (async: the senders are woken to copy it right away)."""
        for kick in self._kicks:
            kick.set()
        if self._config.mode == "sync":
            await self._in_sync_durable()
        # The fence: a leader whose lease ran out meanwhile answers nothing.
        if self._closed or not self._roles.current().is_leader:
            raise RefusedError(Code.HA_NOT_AVAILABLE, "this node stopped leading during the write")

    async def _in_sync_durable(self) -> None:
        """Group commit: every write waiting here needs, from each in-sync follower, the
        acknowledgement of a complete batch whose ticket is at least the write's, so one
        acknowledgement completes all the writes its batch holds (``_settle``), however many
        there are, including those that asked after it was taken."""
        waiter = _Waiter(
            changes.newest(),
            self._clock.monotonic() + self._config.sync_timeout_ms / 1000,
            asyncio.get_running_loop().create_future(),
        )
        self._waiters.append(waiter)
        self._waiter_added.set()
        self._settle()  # no follower to wait for (min_in_sync 1), or closed
        await waiter.future

    def _settle(self) -> None:
        """Answer the waiting writes whose batch every in-sync follower made durable; refuse
        them all when the in-sync set shrank below min_in_sync."""
        waiters = self._waiters
        if not waiters:
            return
        if self._closed:
            while waiters:
                _answer(waiters.popleft().future)
            return
        members = self.in_sync.members
        if 1 + len(members) < self.min_in_sync:
            while waiters:
                _answer(waiters.popleft().future, RefusedError(
                    Code.HA_NOT_AVAILABLE,
                    f"the in-sync set shrank below {self.min_in_sync} nodes during the write; "
                    "it may be applied on this node only: retry it",
                ))  # fmt: skip
            return
        followers = self.in_sync.followers
        durable = min((followers[m].acked_id for m in members), default=None)
        while waiters and (durable is None or waiters[0].target <= durable):
            _answer(waiters.popleft().future)

    async def _expire_waiters(self) -> None:
        """Refuse each write still waiting at its deadline (SLAVE_PERSISTENCE_TIMEOUT)."""
        waiters = self._waiters
        while True:
            while waiters and waiters[0].future.done():  # answered or cancelled
                waiters.popleft()
            if not waiters:
                self._waiter_added.clear()
                await self._waiter_added.wait()
                continue
            delay = waiters[0].deadline - self._clock.monotonic()
            if delay > 0:
                await self._clock.sleep(delay)
                continue
            _answer(waiters.popleft().future, RefusedError(
                Code.SLAVE_PERSISTENCE_TIMEOUT,
                f"the in-sync followers did not confirm within {self._config.sync_timeout_ms} "
                "ms; the write may be applied: retry it",
            ))  # fmt: skip

    def status(self) -> list[FollowerStatus]:
        """Each follower seen in this epoch (for `admin cluster status` and metrics)."""
        end = log_end(list_segments(self._dir))
        return [
            FollowerStatus(
                name=node,
                connected=progress.connected,
                in_sync=node in self.in_sync.members,
                lag_bytes=max(0, end - progress.commitlog_end),
                lag_s=self.in_sync.lag_s(node),
            )
            for node, progress in sorted(self.in_sync.followers.items())
        ]

    # -- in-sync set -------------------------------------------------------------------------
    async def _watch_in_sync(self) -> None:
        while True:
            await self.reevaluate()
            await self._clock.sleep(_EVALUATE_EVERY_S)

    async def reevaluate(self) -> None:
        """Apply what the in-sync bookkeeping says now, reporting each change through the role
        source: a shrink before the member stops being waited for, a growth after it starts
        being waited for. A report that fails is retried at the next evaluation; until a
        shrink is recorded, the member is still waited for (writes time out, never lie)."""
        async with self._evaluating:
            change = self.in_sync.evaluate()
            if change.left:
                shrink = Change(frozenset(), change.left)
                if await self._report(self.in_sync.with_change(shrink)):
                    self.in_sync.apply(shrink)
                    self._log_change(shrink)
            if change.joined:
                grow = Change(change.joined, frozenset())
                self.in_sync.apply(grow)
                self._log_change(grow)
            if self._reported != self.members:  # the first report, or one that failed
                await self._report(self.members)
            self._settle()

    def _log_change(self, change: Change) -> None:
        log.info("replication: in-sync set of epoch %d is now %s (joined %s, left %s)",
                 self._role.epoch, sorted(self.members), sorted(change.joined),
                 sorted(change.left))  # fmt: skip

    async def _report(self, members: frozenset[str]) -> bool:
        if self._closed:
            return False  # a closed leader records nothing: its successor (even of the same
            # epoch, after a fence) reports its own set, and a late one would overwrite it
        if members == self._reported:
            return True
        try:
            await self._roles.report_in_sync(self._role.epoch, members)
        except Exception as error:
            log.warning("replication: could not record the in-sync set %s of epoch %d: %s",
                        sorted(members), self._role.epoch, error)  # fmt: skip
            return False
        self._reported = members
        return True

    def waits_beyond(self, ticket: int) -> bool:
        """A write waits on the barrier that a batch of ``ticket`` does not hold (it needs a
        newer batch, even an empty one)."""
        waiters = self._waiters
        return bool(waiters) and waiters[-1].target > ticket  # targets only grow

    async def acknowledged(
        self,
        node: str,
        ticket: int,
        taken_at: float,
        complete: bool,
        end: int,
        generation: int | None = None,
    ) -> None:
        """``node`` made a batch of ``ticket`` (taken at ``taken_at``) durable, on its stream
        ``generation``. An acknowledgement read late from an older stream says nothing of the
        copy now (the new stream may have reset or cut it): ignored."""
        if generation is not None and self._sessions.get(node) != generation:
            return
        self.in_sync.acked(node, ticket, taken_at, complete, end)
        if complete and node not in self.in_sync.members and not self._closed:
            await self.reevaluate()
        self._settle()

    # -- the stream --------------------------------------------------------------------------
    async def Replicate(
        self, request_iterator: AsyncIterator[pb.ReplicaReport], context: Any
    ) -> None:
        reports = request_iterator.__aiter__()
        first = await reports.__anext__()
        if first.WhichOneof("kind") != "hello":
            await context.abort(_INVALID, "the first report must be a hello")
        hello = first.hello
        node = hello.node
        if hello.known_epoch > self._role.epoch:
            log.warning("replication: %s knows epoch %d, newer than this leader's %d: refused",
                        node, hello.known_epoch, self._role.epoch)  # fmt: skip
            await context.abort(_FAILED, f"this leader's epoch {self._role.epoch} is stale")
        start, truncate, reset = self._start_point(hello)
        generation = self._sessions.get(node, 0) + 1
        self._sessions[node] = generation
        self.in_sync.connected(node)
        snapshotter = DataSnapshotter(self._dir, start, copy_keyring=self._copy_keyring)
        session = _Session(self, node, snapshotter, generation)
        self._kicks.add(session.kick)
        try:
            # This stream may reset or cut the follower's copy: it leaves the recorded in-sync
            # set (where elections read it) before it is sent anything, and rejoins once it
            # caught up again. Not recorded (etcd away): no stream now, the follower retries.
            await self.reevaluate()
            if node in self.in_sync.members:
                failure: tuple[grpc.StatusCode, str] | None = (
                    grpc.StatusCode.UNAVAILABLE,
                    "the leader could not record that this follower left the in-sync set; retry",
                )
            else:
                log.info("replication: %s follows from %d (truncate %d, reset %s)",
                         node, start, truncate, reset)  # fmt: skip
                failure = await session.run(reports, context, truncate, reset)
        finally:
            self._kicks.discard(session.kick)
            if self._sessions.get(node) == generation:
                self.in_sync.disconnected(node)
                if not self._closed:
                    self._tasks.spawn(self.reevaluate(), "in-sync")
        if failure is not None:
            await context.abort(*failure)

    def _start_point(self, hello: pb.Hello) -> tuple[int, int, bool]:
        """(first position to send, position to cut the follower back to or -1, reset)."""
        segments = list_segments(self._dir)
        leader_min = segments[0][0] if segments else 0
        leader_end = log_end(segments)
        follower = [(e.epoch, e.start_offset) for e in hello.epochs]
        if hello.commitlog_end == 0 and not follower:
            return leader_min, -1, True  # empty: bootstrap (reset clears stray files)
        point = epochs.consistent_point(self._history.entries, leader_end, follower,
                                        hello.commitlog_end)  # fmt: skip
        if point < 0 or point < leader_min:
            return leader_min, -1, True
        truncate = point if point < hello.commitlog_end else -1
        return point, truncate, False


class _Session:
    """One follower's stream: up to WINDOW batches in flight, acknowledged in order."""

    # One batch in flight: measured on the shared 2-core VM with a leader and two followers
    # (10,000 sends, pops and acks), 4 in flight cost the leader 30% more CPU and doubled
    # the follower's, for a longer barrier (p50 74-90 ms against 44-63 ms).
    WINDOW = 1

    def __init__(
        self, leader: ReplicationLeader, node: str, snapshotter: DataSnapshotter, generation: int
    ) -> None:
        self.leader = leader
        self.node = node
        self.snapshotter = snapshotter
        self.generation = generation  # of the node's streams: acks of older ones are stale
        self.kick = asyncio.Event()
        # (sequence, ticket, taken at, complete) of each batch sent and not yet acknowledged
        self.in_flight: deque[tuple[int, int, float, bool]] = deque()
        self.space = asyncio.Event()  # set: fewer than WINDOW batches in flight
        self.space.set()
        self.failure: tuple[grpc.StatusCode, str] | None = None

    async def run(
        self, reports: AsyncIterator[pb.ReplicaReport], context: Any, truncate: int, reset: bool
    ) -> tuple[grpc.StatusCode, str] | None:
        async with anyio.create_task_group() as group:

            async def until_one_ends(work: Any) -> None:
                try:
                    await work
                except Exception as error:  # the follower went away: the stream is over
                    log.debug("replication: %s: stream ended: %r", self.node, error)
                finally:
                    group.cancel_scope.cancel()

            group.start_soon(until_one_ends, self._read_acks(reports))
            group.start_soon(until_one_ends, self._send(context, truncate, reset))
        return self.failure

    async def _read_acks(self, reports: AsyncIterator[pb.ReplicaReport]) -> None:
        max_lag = self.leader._config.max_lag_s
        loop = asyncio.get_running_loop()
        # One cancel scope for the stream and one timer that looks at the read in progress
        # (``_AckWatch``): an acknowledgement only notes when the next read began. Moving the
        # scope's deadline twice per acknowledgement (a timer cancelled and made each time)
        # was a visible share of a leader's CPU per batch.
        with anyio.CancelScope() as waited:
            watch = _AckWatch(loop, waited, max_lag)
            try:
                while True:
                    watch.reading_since = loop.time()
                    report = await reports.__anext__()
                    watch.reading_since = None
                    if not await self._acknowledge(report):
                        return
            finally:
                watch.stop()
        if waited.cancelled_caught:
            log.warning("replication: %s acknowledged nothing for %.1f s; its stream is "
                        "closed", self.node, max_lag)  # fmt: skip
            self.failure = (grpc.StatusCode.DEADLINE_EXCEEDED, "no acknowledgement")

    async def _acknowledge(self, report: pb.ReplicaReport) -> bool:
        """Count the follower's acknowledgement of its oldest batch in flight (False: it was
        not that; the stream ends)."""
        if (
            report.WhichOneof("kind") != "ack"
            or not self.in_flight
            or report.ack.sequence != self.in_flight[0][0]
        ):
            self.failure = (_INVALID, "expected the acknowledgement of the oldest batch")
            return False
        _, ticket, taken_at, complete = self.in_flight.popleft()
        if len(self.in_flight) < self.WINDOW:
            self.space.set()
        await self.leader.acknowledged(self.node, ticket, taken_at, complete,
                                       report.ack.commitlog_end, self.generation)  # fmt: skip
        return True

    async def _send(self, context: Any, truncate: int, reset: bool) -> None:
        leader = self.leader
        clock = leader._clock
        poll_s = leader._config.poll_ms / 1000
        interval_s = leader._config.batch_interval_ms / 1000
        heartbeat_s = heartbeat_interval_s(leader._config)
        sequence = 0
        caught_up = False
        sent_ticket = -1  # of the last complete batch sent on this stream
        sent_at = clock.monotonic()
        while not leader._closed:
            await self.space.wait()
            if caught_up and interval_s:  # a round trip shorter than the interval: wait it out
                early = sent_at + interval_s - clock.monotonic()
                if early > 0:
                    await clock.sleep(early)
            if caught_up:  # everything was sent: wait for a write, or the next look
                await _wait_for_work(self.kick, poll_s)
            now = clock.monotonic()
            try:
                snapshot = self.snapshotter.take(leader._history.entries, now)
            except FollowerBehindRetention as behind:
                log.warning("replication: %s: %s", self.node, behind)
                self.failure = (_FAILED, str(behind))  # it reconnects and starts over
                return
            if (
                caught_up
                and snapshot.empty
                and not leader.waits_beyond(sent_ticket)
                and now - sent_at < heartbeat_s
            ):
                continue  # nothing to copy and no write needs a newer batch: no batch (each
                # costs both sides)
            sent_at = now
            if snapshot.complete:
                sent_ticket = snapshot.ticket
            sequence += 1
            self.in_flight.append((sequence, snapshot.ticket, snapshot.taken_at,
                                   snapshot.complete))  # fmt: skip
            if len(self.in_flight) >= self.WINDOW:
                self.space.clear()
            batch = make_batch(
                snapshot, sequence, leader._role.epoch, leader._history.entries,
                truncate=truncate if sequence == 1 else -1, reset=reset and sequence == 1,
            )  # fmt: skip
            await context.write(batch)
            caught_up = snapshot.complete


def make_batch(
    snapshot: Snapshot,
    sequence: int,
    epoch: int,
    history: list[epochs.Entry],
    *,
    truncate: int = -1,
    reset: bool = False,
) -> pb.ReplicaBatch:
    return pb.ReplicaBatch(
        sequence=sequence,
        epoch=epoch,
        truncate_to=truncate,
        reset=reset,
        epochs=[pb.EpochEntry(epoch=e, start_offset=s) for e, s in history],
        commitlog_min=snapshot.commitlog_min,
        commitlog_segment=snapshot.commitlog_segment,
        commitlog_offset=snapshot.commitlog_offset,
        commitlog_data=snapshot.commitlog_data,
        files=snapshot.files,
        complete=snapshot.complete,
    )


async def _wait_for_work(kick: asyncio.Event, poll_s: float) -> None:
    """Until a write waits on the barrier (kick), or poll_s passed (a timer handle, not a
    cancel scope: this wait comes once per batch)."""
    if not kick.is_set():
        timer = asyncio.get_running_loop().call_later(poll_s, kick.set)
        try:
            await kick.wait()
        finally:
            timer.cancel()
    kick.clear()


def heartbeat_interval_s(config: ReplicationConfig) -> float:
    """How often an idle follower gets an empty batch: often enough that its catch-up time
    stays far inside ``max_lag_s``, and never more often than the broker is looked at."""
    return max(config.poll_ms / 1000, min(1.0, config.max_lag_s / 4))


class _AckWatch:
    """Cancels ``scope`` once one read of an acknowledgement has waited ``max_lag_s``.

    The reader sets ``reading_since`` (the loop's time) when a read starts and ``None`` once
    it returned: two stores per acknowledgement. The timer fires at most once per
    ``max_lag_s`` of the read in progress and re-arms itself for that read's own deadline, so
    the bound is the same as a deadline moved before each read."""

    __slots__ = ("_loop", "_max_lag", "_scope", "_timer", "reading_since")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, scope: anyio.CancelScope, max_lag_s: float
    ) -> None:
        self._loop = loop
        self._scope = scope
        self._max_lag = max_lag_s
        self.reading_since: float | None = None
        self._timer: asyncio.TimerHandle | None = loop.call_at(loop.time() + max_lag_s,
                                                               self._check)  # fmt: skip

    def _check(self) -> None:
        now = self._loop.time()
        since = self.reading_since
        if since is not None and now >= since + self._max_lag:
            self._timer = None
            self._scope.cancel()
            return
        # Not reading (acknowledging), or a read that began later: look again at its deadline.
        due = since + self._max_lag if since is not None else now + self._max_lag
        self._timer = self._loop.call_at(due, self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


@dataclass(slots=True)
class _Waiter:
    target: int  # the write's ticket: the newest change mark when it asked
    deadline: float
    future: asyncio.Future[None]


def _answer(future: asyncio.Future[None], error: RefusedError | None = None) -> None:
    if future.done():  # its caller was cancelled
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


_INVALID = grpc.StatusCode.INVALID_ARGUMENT
_FAILED = grpc.StatusCode.FAILED_PRECONDITION
