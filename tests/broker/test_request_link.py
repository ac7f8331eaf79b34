"""The request link (multiplexed Call streams) under loss: a stream killed mid-request fails
what was in flight on it loudly (BrokerUnavailableError, the failover's signal), no poll hangs,
and no message is missed: every message is acked in the end, by a retry or a redelivery."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import pytest
from popmq.broker.contract.errors import BrokerUnavailableError, Code, RefusedError
from popmq.broker.contract.types import (
    AckEntry,
    AckEntryResult,
    FilterExpression,
    Message,
    NotifyRequest,
    PopRequest,
    PopResult,
)
from popmq.broker.contract.watch import VisibilityWatch, WatchKey, WatchState
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.broker.wire.remote import RemoteBrokerPort
from popmq.broker.wire.server import BrokerGrpcServer, BrokerServicer

from popmq.config import BrokerLinkConfig
from popmq.lifecycle import TaskOwner
from popmq.pb.broker.v1 import broker_pb2_grpc

TOPIC, GROUP = "t", "g"


class GatedPort(LocalBrokerPort):
    """Holds every ack at the broker until the gate opens: an ack 'in flight'."""

    def __init__(self, broker: object) -> None:
        super().__init__(broker)  # type: ignore[arg-type]
        self.gate = asyncio.Event()
        self.gate.set()
        self.acks_held = 0

    async def ack(self, group: str, topic: str, entries: list[AckEntry]) -> list[AckEntryResult]:
        self.acks_held += 1
        await self.gate.wait()
        return await super().ack(group, topic, entries)


@contextlib.asynccontextmanager
async def _served(
    tmp_path: Path, **link: object
) -> AsyncIterator[tuple[GatedPort, RemoteBrokerPort]]:
    async with running_broker(fast_broker_config(tmp_path / "b0", name="b0")) as broker:
        local = GatedPort(broker)
        await local.create_topic(TOPIC, 2)
        server = BrokerGrpcServer(local)
        await server.start()
        remote = RemoteBrokerPort("b0", server.address, link=BrokerLinkConfig(**link))
        try:
            yield local, remote
        finally:
            await remote.aclose()
            await server.aclose(0)


def _pop(poll_ms: int = 0, invisible_ms: int = 300) -> PopRequest:
    return PopRequest(
        group=GROUP, topic=TOPIC, max_messages=32, invisible_time_ms=invisible_ms,
        poll_time_ms=poll_ms,
    )  # fmt: skip


async def test_a_killed_stream_drops_no_ack_and_hangs_no_poll(tmp_path: Path) -> None:
    async with _served(tmp_path, coalesce_ms=1.0, streams=1) as (local, remote):
        sent = await remote.send([Message(topic=TOPIC, body=b"m%d" % i) for i in range(20)])
        ids = {r.message_id for r in sent}
        popped = (await remote.pop(_pop())).messages
        assert popped

        # Acks go out coalesced and are held at the broker; a long poll waits beside them
        # on the same stream.
        local.gate.clear()
        acks = [
            asyncio.create_task(
                remote.ack(GROUP, TOPIC, [AckEntry(m.receipt_handle, m.message.message_id)])
            )
            for m in popped
        ]
        poll = asyncio.create_task(remote.pop(_pop(poll_ms=30_000)))
        for _ in range(500):
            if local.acks_held and remote.request_link and remote.request_link.in_flight >= 2:
                break
            await asyncio.sleep(0.01)
        assert local.acks_held >= 1
        acks_per_request = len(acks) / local.acks_held
        assert acks_per_request > 1  # coalesced: fewer requests than acks

        remote.request_link.break_streams()  # type: ignore[union-attr]

        # Everything in flight is reported, promptly (the poll had 30 s left).
        async with asyncio.timeout(10):
            outcomes = await asyncio.wait([*acks, poll])
        assert not outcomes[1]
        for task in [*acks, poll]:
            assert isinstance(task.exception(), BrokerUnavailableError)
        local.gate.set()

        # The next request opens a new stream; retrying the reported acks and popping what
        # comes back leaves no message behind.
        acked: set[str] = set()
        for message in popped:
            result = await remote.ack(
                GROUP, TOPIC, [AckEntry(message.receipt_handle, message.message.message_id)]
            )
            if result[0].code == Code.OK:
                acked.add(message.message.message_id)
        for _ in range(200):
            if acked == ids:
                break
            got = (await remote.pop(_pop(poll_ms=200))).messages
            if got:
                results = await remote.ack(
                    GROUP, TOPIC, [AckEntry(m.receipt_handle, m.message.message_id) for m in got]
                )
                acked |= {r.message_id for r in results if r.code == Code.OK}
        assert acked == ids
        link = remote.request_link
        assert link is not None
        assert link.streams[0].connects >= 2 and link.streams[0].losses == 1


async def test_a_broker_without_the_call_method_gets_unary_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older broker answers Call with UNIMPLEMENTED: the port falls back, nothing is lost."""
    monkeypatch.setattr(BrokerServicer, "Call", broker_pb2_grpc.BrokerServiceServicer.Call)
    async with _served(tmp_path) as (_, remote):
        sent = await remote.send([Message(topic=TOPIC, body=b"x")])
        popped = (await remote.pop(_pop())).messages
        assert [m.message.message_id for m in popped] == [sent[0].message_id]
        assert remote.request_link is not None
        assert remote.request_link.streams[0].connects == 1


async def test_unary_mode_opens_no_stream(tmp_path: Path) -> None:
    async with _served(tmp_path, requests="unary") as (_, remote):
        await remote.send([Message(topic=TOPIC, body=b"x")])
        assert len((await remote.pop(_pop())).messages) == 1
        assert remote.request_link is None


async def test_a_deadline_cancels_the_held_request_on_the_broker(tmp_path: Path) -> None:
    """A long poll whose caller gives up is dropped on the broker (LinkCancel), and the
    stream goes on serving."""
    async with _served(tmp_path, streams=1) as (local, remote):
        await remote.send([Message(topic=TOPIC, body=b"warm")])
        await remote.pop(_pop(invisible_ms=60_000))
        held = asyncio.create_task(remote.pop(_pop(poll_ms=30_000)))
        holds = local.broker.hold_table
        for _ in range(500):
            if holds.total:
                break
            await asyncio.sleep(0.01)
        assert holds.total == 1
        held.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await held
        assert remote.request_link is not None
        assert remote.request_link.in_flight == 0
        for _ in range(500):
            if not holds.total:
                break
            await asyncio.sleep(0.01)
        assert holds.total == 0  # the broker let go of it
        stream = remote.request_link.streams[0]
        for _ in range(500):  # and said so: the proxy waits for no late answer to it
            if not stream.late:
                break
            await asyncio.sleep(0.01)
        assert stream.late == {}
        sent = await remote.send([Message(topic=TOPIC, body=b"after")])
        got = (await remote.pop(_pop())).messages
        assert [m.message.message_id for m in got] == [sent[0].message_id]


class AnswersAsItsCallerGoes(LocalBrokerPort):
    """Cancels ``caller`` the moment its pop takes messages: the proxy gives the pop up (its
    receive's deadline, the client gone) while the broker's answer is on its way."""

    caller: asyncio.Task[object] | None = None

    async def pop(self, request: PopRequest) -> PopResult:
        result = await super().pop(request)
        if result.messages and self.caller is not None:
            self.caller.cancel()
            self.caller = None
        return result


async def _late_pop(
    tmp_path: Path,
    broker_class: type[AnswersAsItsCallerGoes],
    repoll_ms: int,
    *,
    requests: Literal["stream", "unary"] = "stream",
    poll_ms: int = 30_000,
) -> tuple[str, list[str], int]:
    """A held pop over a one-stream link (or a unary call), answered with a message just as
    its caller goes; then a second pop. Gives the message sent, the ids the second pop got,
    and the port's count of late-popped messages."""
    async with running_broker(fast_broker_config(tmp_path / "b0", name="b0")) as broker:
        local = broker_class(broker)
        await local.create_topic(TOPIC, 1)
        server = BrokerGrpcServer(local)
        await server.start()
        link = BrokerLinkConfig(streams=1, requests=requests)
        remote = RemoteBrokerPort("b0", server.address, link=link)
        try:
            held = asyncio.create_task(remote.pop(_pop(poll_ms=poll_ms, invisible_ms=60_000)))
            local.caller = held
            for _ in range(500):
                if broker.hold_table.total:
                    break
                await asyncio.sleep(0.01)
            sent = await remote.send([Message(topic=TOPIC, body=b"x")])
            with pytest.raises(asyncio.CancelledError):
                await held
            # Without the hand-back this waits out its poll time empty (the message invisible).
            again = (await remote.pop(_pop(poll_ms=repoll_ms, invisible_ms=60_000))).messages
            return sent[0].message_id, [m.message.message_id for m in again], remote.late_popped
        finally:
            await remote.aclose()
            await server.aclose(0)


async def test_a_held_pop_answered_as_its_caller_goes_hands_its_messages_back(
    tmp_path: Path,
) -> None:
    """Regression (a `bench e2e --mode cluster` phase of 65 s instead of 10): a held pop woken
    just as the proxy gave it up answered with messages nobody waited for any more; the link
    dropped the answer and the messages stayed invisible for their whole invisible time (60 s
    there). The late answer's messages are now handed back at once."""
    sent, again, late_popped = await _late_pop(tmp_path, AnswersAsItsCallerGoes, 20_000)
    assert again == [sent]
    assert late_popped == 1


async def test_a_unary_held_pop_answered_as_its_deadline_passes_hands_its_messages_back(
    tmp_path: Path,
) -> None:
    """Regression (cancel-pop; `bench e2e --mode cluster-unary` lost 16 messages a run): over
    unary calls (`broker_link.requests=unary`) the proxy cancelled the grpc call of a held pop
    given up at its deadline, and a cancelled call drops its answer: a pop the broker woke at
    that moment left its messages invisible for their whole invisible time. A call whose poll
    time is (about) over now runs on to its end; its answer is handed back."""
    sent, again, late_popped = await _late_pop(
        tmp_path, AnswersAsItsCallerGoes, 20_000, requests="unary", poll_ms=800
    )
    assert again == [sent]
    assert late_popped == 1


class WithoutHandBack(AnswersAsItsCallerGoes):
    """A broker from before HandBack (2026-11-23 to 11-26: it has the Call link already)."""

    async def hand_back(self, group: str, topic: str, receipt_handles: list[str]) -> int:
        raise RefusedError(Code.NOT_IMPLEMENTED, "this broker does not know HandBack")


async def test_a_late_pop_on_a_broker_without_hand_back_is_still_released(
    tmp_path: Path,
) -> None:
    """Review of the late-answer fix: a broker with the Call link but from before HandBack
    refuses the hand-back (NOT_IMPLEMENTED); the late pop's messages were only logged and
    stayed invisible for their whole invisible time, though the proxy's own release
    (BrokerCalls._release) falls back to a change of invisible time to 0 for such a broker,
    and ``popmq_proxy_broker_late_pop_messages`` counted them as handed back.
    Fix: ``RemoteBrokerPort._hand_back_late`` falls back as ``_release`` does (a change of
    invisible time to 0 per handle on NOT_IMPLEMENTED), or count only what was handed back."""
    sent, again, _ = await _late_pop(tmp_path, WithoutHandBack, 5_000)
    assert again == [sent]


async def test_closing_a_unary_port_under_held_calls_fails_them_as_unavailable(
    tmp_path: Path,
) -> None:
    """Regression (review-cancel): closing a port's channel (a retired port, 5 s after a
    leader change, its long polls still held) cancels its unary calls, and awaiting a call
    cancelled so raises a bare CancelledError in a task nobody cancelled. BrokerCalls runs
    every remote pop of the proxy in one owner, whose task group took it for a cancelled
    sibling: all the others were cancelled with it. They fail as the broker unavailable."""
    async with _served(tmp_path, requests="unary") as (local, remote):
        owner = TaskOwner("calls", grace_s=0)
        sibling = owner.spawn(asyncio.sleep(60), "sibling")
        pop = owner.spawn(remote.pop(_pop(poll_ms=20_000)), "pop", log_errors=False)
        notify = NotifyRequest(group=GROUP, topic=TOPIC, poll_time_ms=20_000)
        held = owner.spawn(remote.notify(notify), "notify", log_errors=False)
        assert sibling is not None and pop is not None and held is not None
        for _ in range(1000):
            if local.broker.hold_table.total == 2:
                break
            await asyncio.sleep(0.01)
        assert local.broker.hold_table.total == 2
        await remote.aclose()
        outcomes: list[BaseException | None] = []
        for job in (pop, held):
            try:
                await job.result()
            except BaseException as exc:  # a CancelledError is the defect
                outcomes.append(exc)
            else:
                outcomes.append(None)
        await asyncio.sleep(0.05)
        sibling_ended = sibling.done()
        await owner.aclose()
    assert [type(o) for o in outcomes] == [BrokerUnavailableError] * 2, outcomes
    assert not sibling_ended


async def _outcome(job: object) -> BaseException | None:
    try:
        await job.result()  # type: ignore[attr-defined]
    except BaseException as exc:  # a CancelledError is the defect
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this test's own timeout
        return exc
    return None


async def _waiting_on_the_link(
    local: GatedPort, remote: RemoteBrokerPort, owner: TaskOwner
) -> list[object]:
    """A held pop, a held notify and an ack held at the broker (coalesced), all on the
    request link, each a job of ``owner``; returns once the broker holds all three."""
    local.gate.clear()
    sent = await remote.send([Message(topic=TOPIC, body=b"m")])
    assert sent
    popped = (await remote.pop(_pop(invisible_ms=30_000))).messages
    assert popped
    entry = AckEntry(popped[0].receipt_handle, popped[0].message.message_id)
    notify = NotifyRequest(group=GROUP, topic=TOPIC, poll_time_ms=20_000)
    jobs = [
        owner.spawn(remote.pop(_pop(poll_ms=20_000)), "pop", log_errors=False),
        owner.spawn(remote.notify(notify), "notify", log_errors=False),
        owner.spawn(remote.ack(GROUP, TOPIC, [entry]), "ack", log_errors=False),
    ]
    for _ in range(1000):
        if local.broker.hold_table.total == 2 and local.acks_held == 1:
            break
        await asyncio.sleep(0.01)
    assert local.broker.hold_table.total == 2 and local.acks_held == 1
    assert remote.request_link is not None and remote.request_link.in_flight == 3
    return [job for job in jobs if job is not None]


async def test_closing_a_linked_port_under_held_calls_fails_them_and_cancels_no_sibling(
    tmp_path: Path,
) -> None:
    """link-cancel: review-cancel's question for the request link (the default mode). A port
    closed while calls wait on its Call stream (a retired port closed 5 s after a leader
    change, or the proxy stopping) fails each waiting call as the broker unavailable (the
    stream's reader, cancelled by the close, fails its waiters: LinkStream._lost; the
    coalescer its callers), never a bare CancelledError, so the owner running them (BrokerCalls'
    in the proxy) cancels no sibling."""
    async with _served(tmp_path, coalesce_ms=1.0, streams=1) as (local, remote):
        owner = TaskOwner("calls", grace_s=0)
        sibling = owner.spawn(asyncio.sleep(60), "sibling")
        assert sibling is not None
        jobs = await _waiting_on_the_link(local, remote, owner)
        await remote.aclose()
        outcomes = [await _outcome(job) for job in jobs]
        await asyncio.sleep(0.05)
        sibling_ended = sibling.done()
        await owner.aclose()
        local.gate.set()
    assert [type(o) for o in outcomes] == [BrokerUnavailableError] * 3, outcomes
    assert not sibling_ended


async def test_a_broker_gone_under_the_link_fails_its_waiters_and_cancels_no_sibling(
    tmp_path: Path,
) -> None:
    """link-cancel: the Call stream's reader ending under waiting calls (the broker's server
    stopped: the stream is cancelled from the far end) fails them as the broker unavailable;
    none hangs and the owner running them cancels no sibling."""
    async with running_broker(fast_broker_config(tmp_path / "b0", name="b0")) as broker:
        local = GatedPort(broker)
        await local.create_topic(TOPIC, 2)
        server = BrokerGrpcServer(local)
        await server.start()
        link = BrokerLinkConfig(coalesce_ms=1.0, streams=1)
        remote = RemoteBrokerPort("b0", server.address, link=link)
        owner = TaskOwner("calls", grace_s=0)
        try:
            sibling = owner.spawn(asyncio.sleep(60), "sibling")
            assert sibling is not None
            jobs = await _waiting_on_the_link(local, remote, owner)
            local.gate.set()  # the held ack may finish; the long polls stay held
            stopping = asyncio.ensure_future(server.aclose(0))
            async with asyncio.timeout(10):  # the polls had 20 s left
                outcomes = [await _outcome(job) for job in jobs[:2]]
            await stopping
            await asyncio.sleep(0.05)
            sibling_ended = sibling.done()
        finally:
            await owner.aclose()
            await remote.aclose()
    assert [type(o) for o in outcomes] == [BrokerUnavailableError] * 2, outcomes
    assert not sibling_ended


@pytest.mark.parametrize("end", ["port closed", "broker gone"])
async def test_a_watch_link_ended_under_an_armed_watch_wakes_it_and_cancels_no_sibling(
    tmp_path: Path, end: str
) -> None:
    """link-cancel: the Watch stream (BrokerLink) ended under an armed watch, by the port
    closing (its reader cancelled by its own owner) or by the broker going away (the stream
    ends from the far end), wakes the watch as UNKNOWN (its long poll pops once, as after
    any loss): no waiter hangs and no CancelledError reaches the owner running it."""
    async with running_broker(fast_broker_config(tmp_path / "b0", name="b0")) as broker:
        local = LocalBrokerPort(broker)
        await local.create_topic(TOPIC, 2)
        server = BrokerGrpcServer(local)
        await server.start()
        remote = RemoteBrokerPort("b0", server.address, link=BrokerLinkConfig())
        owner = TaskOwner("waits", grace_s=0)
        try:
            sibling = owner.spawn(asyncio.sleep(60), "sibling")
            watch = VisibilityWatch(
                WatchKey(GROUP, TOPIC, FilterExpression(), False), remote.watch_backend
            )
            watch.arm()
            waiting = owner.spawn(watch.wait(), "watch", log_errors=False)
            assert sibling is not None and waiting is not None
            for _ in range(1000):  # the arm reached the broker (nothing visible: it holds)
                if remote.watch_backend.connects and remote.watch_backend.up:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            assert watch.state is WatchState.ARMED and not waiting.done()
            if end == "port closed":
                await remote.aclose()
            else:
                await server.aclose(0)
            async with asyncio.timeout(10):
                outcome = await _outcome(waiting)
            state = watch.state
            await asyncio.sleep(0.05)
            sibling_ended = sibling.done()
            watch.close()
        finally:
            await owner.aclose()
            await remote.aclose()
            await server.aclose(0)
    assert outcome is None and state is WatchState.UNKNOWN
    assert not sibling_ended


async def test_the_cluster_token_rides_the_streams(tmp_path: Path) -> None:
    """Regression: grpc.aio filed the token interceptor under unary calls only, so a broker
    with a cluster token refused the Call and Watch streams (UNAUTHENTICATED)."""
    token = tmp_path / "cluster-token"
    token.write_text("a-cluster-token-long-enough-1234")
    token.chmod(0o600)
    config = fast_broker_config(tmp_path / "b0", name="b0").model_copy(
        update={"cluster_token_file": token}
    )
    async with running_broker(config) as broker:
        local = LocalBrokerPort(broker)
        await local.create_topic(TOPIC, 2)
        server = BrokerGrpcServer(local, config=config)
        await server.start()
        remote = RemoteBrokerPort(
            "b0", server.address, link=BrokerLinkConfig(cluster_token_file=token)
        )
        try:
            sent = await remote.send([Message(topic=TOPIC, body=b"x")])  # on the Call stream
            assert sent[0].message_id
            watch = VisibilityWatch(
                WatchKey(GROUP, TOPIC, FilterExpression(), False), remote.watch_backend
            )
            watch.arm()
            async with asyncio.timeout(10):
                await watch.wait()
            assert watch.state is WatchState.HAS  # an event, not a lost link (UNKNOWN)
            watch.close()
        finally:
            await remote.aclose()
            await server.aclose(0)


async def test_the_window_bounds_requests_in_flight(tmp_path: Path) -> None:
    """Flow control: with a window of 1 a second request waits for the first one's answer
    before it is sent (the broker never sees it meanwhile), then goes through."""
    async with _served(tmp_path, streams=1, window=1, coalesce_ms=0) as (local, remote):
        sent = await remote.send([Message(topic=TOPIC, body=b"m%d" % i) for i in range(2)])
        popped = (await remote.pop(_pop(invisible_ms=60_000))).messages
        assert len(popped) == 2 and len(sent) == 2
        local.gate.clear()
        acks = [
            asyncio.create_task(
                remote.ack(GROUP, TOPIC, [AckEntry(m.receipt_handle, m.message.message_id)])
            )
            for m in popped
        ]
        for _ in range(500):
            if local.acks_held:
                break
            await asyncio.sleep(0.01)
        for _ in range(20):  # give a wrongly sent second request every chance to arrive
            await asyncio.sleep(0.01)
        assert local.acks_held == 1
        local.gate.set()
        results = [await task for task in acks]
        assert [r[0].code for r in results] == [Code.OK, Code.OK]
        assert local.acks_held == 2


async def test_one_bad_item_in_a_coalesced_batch_fails_only_its_caller(tmp_path: Path) -> None:
    """A forged receipt handle among coalesced acks, and a message the broker refuses among
    coalesced sends: each sibling still gets its own success."""
    async with _served(tmp_path, coalesce_ms=50.0, streams=1) as (_, remote):
        sends = [
            asyncio.create_task(remote.send([Message(topic=TOPIC, body=b"m%d" % i)], 0))
            for i in range(3)
        ]
        bad_send = asyncio.create_task(remote.send([Message(topic=TOPIC, body=b"x", tag="a|b")], 0))
        outcomes = await asyncio.gather(*sends, bad_send, return_exceptions=True)
        assert all(isinstance(o, list) and o[0].message_id for o in outcomes[:3]), outcomes
        assert (
            isinstance(outcomes[3], RefusedError) and outcomes[3].code == Code.ILLEGAL_MESSAGE_TAG
        )
        sends_coalescer = remote.coalescers[1]
        # One batch: refused for the bad tag, then retried per caller.
        assert sends_coalescer is not None and sends_coalescer.batches == 1

        popped = (await remote.pop(_pop(invisible_ms=60_000))).messages
        assert len(popped) == 3
        acks = [
            asyncio.create_task(
                remote.ack(GROUP, TOPIC, [AckEntry(m.receipt_handle, m.message.message_id)])
            )
            for m in popped
        ]
        forged = asyncio.create_task(remote.ack(GROUP, TOPIC, [AckEntry("forged-handle", "x")]))
        results = await asyncio.gather(*acks, forged)
        assert [r[0].code for r in results[:3]] == [Code.OK] * 3
        assert results[3][0].code not in (Code.OK, Code.INTERNAL_ERROR), results[3]
        acks_coalescer = remote.coalescers[0]
        assert acks_coalescer is not None and acks_coalescer.batches == 1  # one request


async def test_long_polls_do_not_hold_up_acks_and_sends(tmp_path: Path) -> None:
    """Regression: held long polls took window slots, so once a proxy held a window's worth
    of polls on a broker (one per receive with the pop strategy; thousands under admission's
    bounds) every ack and send waited behind them into its own deadline."""
    async with _served(tmp_path, streams=1, window=1, coalesce_ms=0) as (_, remote):
        polls = [asyncio.create_task(remote.pop(_pop(poll_ms=60_000))) for _ in range(2)]
        for _ in range(500):
            if remote.request_link and remote.request_link.in_flight == 2:
                break
            await asyncio.sleep(0.01)
        assert remote.request_link is not None and remote.request_link.in_flight == 2
        sent = await remote.send([Message(topic=TOPIC, body=b"while polls wait")])
        assert sent[0].message_id  # not queued behind the polls (it would time out first)
        for task in polls:
            task.cancel()
        await asyncio.wait(polls)


async def test_a_broker_restarted_under_the_link_fails_what_was_in_flight_then_serves(
    tmp_path: Path,
) -> None:
    """The broker's server stops under a held poll and a held ack: both fail as unavailable,
    promptly; once it is back on the same port, the same port object works again."""
    async with running_broker(fast_broker_config(tmp_path / "b0", name="b0")) as broker:
        local = GatedPort(broker)
        await local.create_topic(TOPIC, 2)
        server = BrokerGrpcServer(local)
        await server.start()
        port_number = server.bound_port
        remote = RemoteBrokerPort("b0", server.address, link=BrokerLinkConfig(streams=1))
        try:
            await remote.send([Message(topic=TOPIC, body=b"m")])
            (popped,) = (await remote.pop(_pop(invisible_ms=60_000))).messages
            entry = AckEntry(popped.receipt_handle, popped.message.message_id)
            local.gate.clear()
            ack = asyncio.create_task(remote.ack(GROUP, TOPIC, [entry]))
            poll = asyncio.create_task(remote.pop(_pop(poll_ms=60_000)))
            for _ in range(500):
                if local.acks_held and remote.request_link and remote.request_link.in_flight == 2:
                    break
                await asyncio.sleep(0.01)
            await server.aclose(0)
            async with asyncio.timeout(10):  # the poll had a minute left
                await asyncio.wait([ack, poll])
            for task in (ack, poll):
                assert isinstance(task.exception(), BrokerUnavailableError), task.exception()
            local.gate.set()
            server = BrokerGrpcServer(local, port_number=port_number)
            await server.start()
            for _ in range(100):  # the channel reconnects with its back-off
                try:
                    result = await remote.ack(GROUP, TOPIC, [entry])
                    break
                except BrokerUnavailableError:
                    await asyncio.sleep(0.1)
            assert result[0].code == Code.OK
            assert remote.request_link is not None and remote.request_link.in_flight == 0
        finally:
            await remote.aclose()
            await server.aclose(0)
