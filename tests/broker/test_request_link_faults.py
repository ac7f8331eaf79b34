"""The request link against a broker that misbehaves or a stream that fails oddly (fake calls,
virtual time): every request gets an answer of its own or an error, promptly, and nothing is
left behind in the pending table."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
from popmq.broker.contract.errors import BrokerTimeoutError, BrokerUnavailableError
from popmq.broker.wire.request_link import RequestLink

from popmq.pb.broker.v1 import broker_pb2 as pb

pytestmark = pytest.mark.looptime


def _ok(request: pb.LinkRequest) -> pb.LinkResponse:
    return pb.LinkResponse(id=request.id, send=pb.SendResponse(status=pb.Status(message="ok")))


class FakeCall:
    """A Call stream whose broker answers each request with ``answer(request)`` (None: holds
    it unanswered); ``seen`` records every request it read, cancels included."""

    def __init__(
        self,
        requests: AsyncIterator[bytes],
        answer: Callable[[pb.LinkRequest], list[pb.LinkResponse] | None],
    ) -> None:
        self._requests = requests
        self._answer = answer
        self.seen: list[pb.LinkRequest] = []

    def cancel(self) -> None:
        pass

    async def __aiter__(self) -> AsyncIterator[pb.LinkResponses]:
        async for raw in self._requests:
            batch = pb.LinkRequests.FromString(raw)  # frames go out encoded
            out: list[pb.LinkResponse] = []
            for request in batch.requests:
                self.seen.append(request)
                if request.WhichOneof("call") == "send":
                    out += self._answer(request) or []
            if out:
                yield pb.LinkResponses(responses=out)


class Exploding(FakeCall):
    async def __aiter__(self) -> AsyncIterator[pb.LinkResponses]:
        async for _ in self._requests:
            raise grpc.aio.UsageError("something grpc.aio did not expect")
        yield pb.LinkResponses()  # pragma: no cover - makes this an async generator


async def _running(link: RequestLink) -> asyncio.Task[None]:
    task = asyncio.create_task(link.run())
    await asyncio.sleep(0)
    return task


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_unexpected_stream_error_fails_its_requests_and_the_link_lives_on() -> None:
    """Regression: only AioRpcError and cancellation were handled, so any other error ended
    the link's task for good; every later request then waited out its deadline and coalesced
    callers (who have no deadline of their own) waited forever."""
    calls: list[FakeCall] = []

    def open_call(requests: AsyncIterator[bytes]) -> FakeCall:
        kind = Exploding if not calls else FakeCall
        calls.append(kind(requests, lambda r: [_ok(r)]))
        return calls[-1]

    link = RequestLink("b0", open_call, streams=1, window=8)
    runner = await _running(link)
    try:
        with pytest.raises(BrokerUnavailableError, match="UsageError"):
            await link.request("send", pb.SendRequest(), 30)
        assert not runner.done()
        answer = await link.request("send", pb.SendRequest(), 30)  # a new stream
        assert answer.status.message == "ok"
        assert len(calls) == 2 and link.in_flight == 0
    finally:
        await _stop(runner)


async def test_answers_for_unknown_or_answered_ids_reach_nobody_else() -> None:
    """A broker answering an id nobody waits for, or one id twice, does not answer another
    request with that reply."""

    def answer(request: pb.LinkRequest) -> list[pb.LinkResponse]:
        stray = pb.LinkResponse(id=request.id + 1000, send=pb.SendResponse(
            status=pb.Status(message="stray")))  # fmt: skip
        return [stray, _ok(request), _ok(request)]

    link = RequestLink("b0", lambda requests: FakeCall(requests, answer), streams=1, window=8)
    runner = await _running(link)
    try:
        answers = await asyncio.gather(
            *(link.request("send", pb.SendRequest(), 30) for _ in range(5))
        )
        assert [a.status.message for a in answers] == ["ok"] * 5
        assert link.in_flight == 0
    finally:
        await _stop(runner)


async def test_a_stuck_broker_honours_deadlines_and_cancellations() -> None:
    """Requests the broker never answers end at their deadline, or when their caller goes;
    each leaves the pending table, frees its window slot and tells the broker (LinkCancel)."""
    calls: list[FakeCall] = []

    def open_call(requests: AsyncIterator[bytes]) -> FakeCall:
        calls.append(FakeCall(requests, lambda r: None))
        return calls[-1]

    link = RequestLink("b0", open_call, streams=1, window=1)
    runner = await _running(link)
    try:
        with pytest.raises(BrokerTimeoutError):
            await link.request("send", pb.SendRequest(), 5)
        caller = asyncio.create_task(link.request("send", pb.SendRequest(), 3600))
        for _ in range(10):
            await asyncio.sleep(0)
        assert link.in_flight == 1
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert link.in_flight == 0
        # The window (1) is free again: a third request is sent and times out in its turn.
        with pytest.raises(BrokerTimeoutError):
            await link.request("send", pb.SendRequest(), 5)
        await asyncio.sleep(0)
        kinds = [(r.id, r.WhichOneof("call")) for r in calls[0].seen]
        assert kinds == [(1, "send"), (1, "cancel"), (2, "send"), (2, "cancel"),
                         (3, "send"), (3, "cancel")]  # fmt: skip
    finally:
        await _stop(runner)


class Unavailable(FakeCall):
    """A broker that is down: the stream fails as soon as a request goes out."""

    async def __aiter__(self) -> AsyncIterator[pb.LinkResponses]:
        async for _ in self._requests:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down"
            )
        yield pb.LinkResponses()  # pragma: no cover - makes this an async generator


class AnswersOnce(FakeCall):
    """A stream that answers its first frame, then ends (so the next request opens another)."""

    async def __aiter__(self) -> AsyncIterator[pb.LinkResponses]:
        async for answers in super().__aiter__():
            yield answers
            return


async def test_a_down_broker_logs_once_per_change_of_state_and_counts_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: each request that failed while a broker was down logged a WARNING of its
    own (a log flood during an outage). Now one line when it goes down, one when it is back,
    and the failed requests are counted (popmq_proxy_broker_request_link_failures)."""
    down = [True]

    def open_call(requests: AsyncIterator[bytes]) -> FakeCall:
        return (Unavailable if down[0] else AnswersOnce)(requests, lambda r: [_ok(r)])

    link = RequestLink("b0", open_call, streams=2, window=8)  # the streams share one state
    runner = await _running(link)
    caplog.set_level(logging.DEBUG, logger="popmq.broker.wire.request_link")

    def lines(level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == level]

    try:
        for _ in range(2):  # two outages: a line for each change, none per request
            for _ in range(6):
                with pytest.raises(BrokerUnavailableError):
                    await link.request("send", pb.SendRequest(), 30)
            down[0] = False
            assert (await link.request("send", pb.SendRequest(), 30)).status.message == "ok"
            down[0] = True
        warnings = lines(logging.WARNING)
        assert len(warnings) == 2 and all("is down" in w for w in warnings), warnings
        assert lines(logging.INFO) == ["request link to broker b0 is back"] * 2
        assert link.health.failures == 12 and not link.health.down
    finally:
        await _stop(runner)


def test_request_link_failures_are_a_metric() -> None:
    from popmq.proxy.metrics import ProxyMetrics

    link = RequestLink("b0", lambda requests: None, streams=1, window=1)
    link.health.lost("UNAVAILABLE: down", 3)

    class Port:
        name = "b0"
        request_link = link

    metrics = ProxyMetrics()
    metrics.watch_links([Port()])
    assert (
        metrics.registry.get_sample_value(
            "popmq_proxy_broker_request_link_failures_total", {"broker": "b0"}
        )
        == 3
    )


class Scripted(FakeCall):
    """A stream whose answers the test writes (``answers``); requests are only recorded."""

    def __init__(self, requests: AsyncIterator[bytes]) -> None:
        super().__init__(requests, lambda r: None)
        self.answers: asyncio.Queue[pb.LinkResponse] = asyncio.Queue()

    async def _read(self) -> None:
        async for raw in self._requests:
            self.seen.extend(pb.LinkRequests.FromString(raw).requests)

    async def __aiter__(self) -> AsyncIterator[pb.LinkResponses]:
        reader = asyncio.create_task(self._read())
        try:
            while True:
                yield pb.LinkResponses(responses=[await self.answers.get()])
        finally:
            reader.cancel()


def _popped(request_id: int) -> pb.LinkResponse:
    answer = pb.LinkResponse(id=request_id, pop=pb.PopResponse())
    answer.pop.messages.add(receipt_handle="h1")
    return answer


async def _scripted_link() -> tuple[RequestLink, list[Scripted], asyncio.Task[None]]:
    calls: list[Scripted] = []

    def open_call(requests: AsyncIterator[bytes]) -> Scripted:
        calls.append(Scripted(requests))
        return calls[-1]

    link = RequestLink("b0", open_call, streams=1, window=8)
    return link, calls, await _running(link)


async def test_an_answer_to_a_given_up_request_goes_to_its_late_handler() -> None:
    """Regression: the answer to a pop given up (its caller cancelled) was dropped, though the
    broker had taken messages for it; it now reaches the request's ``late`` handler, whether
    it comes after the caller's cleanup or between the caller's cancel and that cleanup."""
    link, calls, runner = await _scripted_link()
    late: list[pb.LinkResponse] = []
    try:
        for answer_first in (False, True):
            caller = asyncio.create_task(
                link.request("pop", pb.PopRequest(), 30, held=True, late=late.append)
            )
            await asyncio.sleep(0.01)
            request_id = calls[0].seen[-1].id
            if answer_first:  # the answer is read before the cancelled caller runs again
                calls[0].answers.put_nowait(_popped(request_id))
                caller.cancel()
            else:
                caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
            if not answer_first:
                calls[0].answers.put_nowait(_popped(request_id))
            await asyncio.sleep(0.01)
            assert [a.id for a in late] == [request_id], answer_first
            assert [r.pop.messages[0].receipt_handle for r in late] == ["h1"]
            late.clear()
            assert not link.streams[0].late and not link.streams[0].unclaimed
    finally:
        await _stop(runner)


async def test_the_broker_ending_a_cancelled_request_frees_its_late_handler() -> None:
    """The broker answers a cancelled id without a result: the late handler is told once and
    forgotten. A broker that never says so (an older one) leaves at most LATE_MAX handlers."""
    from popmq.broker.wire import request_link

    link, calls, runner = await _scripted_link()
    late: list[pb.LinkResponse] = []
    try:
        caller = asyncio.create_task(link.request("pop", pb.PopRequest(), 30, late=late.append))
        await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        request_id = calls[0].seen[0].id
        assert list(link.streams[0].late) == [request_id]
        calls[0].answers.put_nowait(pb.LinkResponse(id=request_id))
        await asyncio.sleep(0.01)
        assert [a.WhichOneof("result") for a in late] == [None]
        assert not link.streams[0].late
    finally:
        await _stop(runner)
    link, calls, runner = await _scripted_link()  # a broker never seen answering a cancel
    try:
        caller = asyncio.create_task(link.request("pop", pb.PopRequest(), 30, late=late.append))
        await asyncio.sleep(0.01)  # the stream is open
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        for request_id in range(1000, 1000 + request_link.LATE_MAX + 5):
            link.streams[0].cancel(request_id, late.append)
        assert len(link.streams[0].late) == request_link.LATE_MAX
        assert link.streams[0].late_dropped == 6
    finally:
        await _stop(runner)


class CancelsAfterAnswering(Scripted):
    """Runs ``after_answer`` as soon as the link has read an answer, in the reader's own turn:
    the caller's cancel lands after its waiter got the answer and before the caller ran again
    (the receive's deadline or the client going away in the same turn of the loop)."""

    after_answer: Callable[[], None] | None = None

    async def __aiter__(self) -> AsyncIterator[pb.LinkResponses]:
        reader = asyncio.create_task(self._read())
        try:
            while True:
                yield pb.LinkResponses(responses=[await self.answers.get()])
                if self.after_answer is not None:  # the link has handed the answer out
                    self.after_answer()
                    self.after_answer = None
        finally:
            reader.cancel()


async def test_an_answer_read_just_before_its_caller_is_cancelled_is_not_lost() -> None:
    """Review of the late-answer fix (finds a loss it leaves): the reader hands the answer to
    the waiting future (set_result), then, before the caller's task runs again, the caller is
    cancelled (BrokerCalls cancels the held pop's job as its receive gives up; the request's
    own timeout fires in the same turn). asyncio then throws CancelledError into
    ``await waiter``: the answer in the future is never read, it is not in ``unclaimed``
    (the waiter was not done when the reader came), and ``late`` is never called, so the
    popped messages stay invisible for their whole invisible time.
    Fix: in ``RequestLink._request``'s exit path, a waiter that is done with a result the
    caller did not take (``not waiter.cancelled()`` and the await raised) goes to ``late``."""
    calls: list[CancelsAfterAnswering] = []

    def open_call(requests: AsyncIterator[bytes]) -> CancelsAfterAnswering:
        calls.append(CancelsAfterAnswering(requests))
        return calls[-1]

    link = RequestLink("b0", open_call, streams=1, window=8)
    runner = await _running(link)
    late: list[pb.LinkResponse] = []
    try:
        caller = asyncio.create_task(
            link.request("pop", pb.PopRequest(), 30, held=True, late=late.append)
        )
        await asyncio.sleep(0.01)
        request_id = calls[0].seen[-1].id
        calls[0].after_answer = caller.cancel
        calls[0].answers.put_nowait(_popped(request_id))
        with pytest.raises(asyncio.CancelledError):
            await caller  # the caller never saw the answer
        await asyncio.sleep(0.01)
        assert [r.pop.messages[0].receipt_handle for r in late] == ["h1"]
        assert not link.streams[0].late and not link.streams[0].unclaimed
    finally:
        await _stop(runner)


async def test_the_first_burst_of_cancels_on_a_stream_loses_no_late_answer() -> None:
    """Reviews review-stall and review-merge: the late handlers of a stream were cut to 1,024,
    oldest first (at first silently, then until the broker had answered a cancel, which a
    fresh stream's first burst has not). Held pops given up together (clients dropped at once,
    a proxy drain) then lost the late answer of the oldest: its messages stayed invisible for
    their whole invisible time. The cap is now above the long polls a proxy holds."""
    from popmq.broker.wire import request_link

    from popmq.config import ProxyConfig

    assert request_link.LATE_MAX >= ProxyConfig.model_fields["max_long_polls"].default
    link, calls, runner = await _scripted_link()
    late: list[pb.LinkResponse] = []
    try:
        callers = [
            asyncio.create_task(
                link.request("pop", pb.PopRequest(), 30, held=True, late=late.append)
            )
            for _ in range(2 * 1024 + 1)  # more than the cap was
        ]
        await asyncio.sleep(0.01)
        ids = [r.id for r in calls[0].seen if r.WhichOneof("call") == "pop"]
        assert len(ids) == len(callers)
        for caller in callers:  # given up together, the stream's first cancels
            caller.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        # The oldest was answered with a message before its cancel reached the broker.
        calls[0].answers.put_nowait(_popped(ids[0]))
        await asyncio.sleep(0.01)
        assert link.streams[0].late_dropped == 0
        assert [a.id for a in late] == [ids[0]]
    finally:
        await _stop(runner)


async def test_a_request_on_a_closed_link_fails_at_once() -> None:
    """Regression (link-cancel): a port closing closes its link, cancels the link's reader
    (whatever waits on the stream then fails as unavailable) and only then lets go of the
    link. A request made on it meanwhile, or one waiting for a slot of a full window, was
    queued for a stream no reader was left to open or read: it waited out its whole deadline
    (a held pop, its poll time too) and failed as a timeout, not as the broker unavailable."""
    loop = asyncio.get_running_loop()
    link = RequestLink(
        "b0", lambda requests: FakeCall(requests, lambda r: None), streams=1, window=1
    )
    runner = await _running(link)
    holding = asyncio.create_task(link.request("send", pb.SendRequest(), 3600))
    queued = asyncio.create_task(link.request("send", pb.SendRequest(), 3600))  # no slot
    for _ in range(10):
        await asyncio.sleep(0)
    assert link.in_flight == 1 and not queued.done()
    start = loop.time()
    link.close()
    await _stop(runner)
    for caller in (holding, queued):
        with pytest.raises(BrokerUnavailableError):
            await caller
    with pytest.raises(BrokerUnavailableError):
        await link.request("pop", pb.PopRequest(), 3600, held=True)
    assert loop.time() - start < 1  # virtual time: none waited for its deadline
    assert link.in_flight == 0
