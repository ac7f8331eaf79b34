"""TaskOwner and fan_out: one shutdown policy, no task outlives its owner, gather's errors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from popmq.broker.contract.errors import Code, RefusedError

from popmq.lifecycle import TaskOwner, fan_out

pytestmark = pytest.mark.looptime


async def test_aclose_drains_within_grace_then_cancels() -> None:
    owner = TaskOwner("t", grace_s=1.0)
    finished: list[str] = []

    async def work(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        finished.append(name)

    short = owner.spawn(work("short", 0.5), "short")
    long = owner.spawn(work("long", 10), "long")
    assert short is not None and long is not None
    await owner.aclose()
    assert finished == ["short"]
    assert short.done() and not short.cancelled()
    assert long.done() and long.cancelled()
    assert len(owner) == 0
    assert owner.spawn(work("late", 0), "late") is None  # refused after close


async def test_failure_is_kept_and_siblings_run_on() -> None:
    owner = TaskOwner("t")

    async def boom() -> None:
        raise RefusedError(Code.BAD_REQUEST, "x")

    async def fine() -> int:
        await asyncio.sleep(0.1)
        return 7

    bad = owner.spawn(boom(), "boom", log_errors=False)
    good = owner.spawn(fine(), "fine")
    assert good is not None and bad is not None
    assert await good.result() == 7
    with pytest.raises(RefusedError):
        await bad.result()
    await owner.aclose()


async def test_no_task_outlives_the_owner() -> None:
    before = asyncio.all_tasks()
    owner = TaskOwner("t", grace_s=0)
    for i in range(5):
        owner.spawn(asyncio.sleep(100), f"s{i}")
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks() - before) > 1
    await owner.aclose()
    assert asyncio.all_tasks() - before == set()


async def test_job_cancel_before_start_never_runs() -> None:
    owner = TaskOwner("t")
    ran: list[int] = []

    async def work() -> None:
        ran.append(1)

    job = owner.spawn(work(), "w")
    assert job is not None
    job.cancel()
    await job.wait()
    assert job.cancelled() and ran == []
    await owner.aclose()


async def test_fan_out_keeps_order_and_raises_the_first_error_itself() -> None:
    async def value(v: int, delay: float) -> int:
        await asyncio.sleep(delay)
        return v

    assert await fan_out([value(1, 0.3), value(2, 0.1), value(3, 0.2)]) == [1, 2, 3]

    cancelled: list[bool] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def fail() -> None:
        raise RefusedError(Code.TOPIC_NOT_FOUND, "gone")

    with pytest.raises(RefusedError) as caught:
        await fan_out([slow(), fail()])
    assert caught.value.code is Code.TOPIC_NOT_FOUND
    assert cancelled == [True]  # the sibling does not run on (gather left it running)

    answers = await fan_out([value(1, 0), fail()], return_exceptions=True)
    assert answers[0] == 1 and isinstance(answers[1], RefusedError)


async def test_follow_up_work_of_a_draining_task_is_accepted() -> None:
    owner = TaskOwner("t", grace_s=5)
    done: list[str] = []

    async def follow_up() -> None:
        await asyncio.sleep(0.1)
        done.append("follow-up")

    async def first() -> None:
        await asyncio.sleep(0.1)
        owner.spawn(follow_up(), "follow-up")  # e.g. the release a finished pop causes

    owner.spawn(first(), "first")
    await owner.aclose()
    assert done == ["follow-up"]


async def test_a_task_runs_in_its_spawners_context() -> None:
    """Trace spans and other context variables go with the work (as with create_task), also
    for the first task, which waits for the owner's host task to open its group."""
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="none")
    owner = TaskOwner("t")

    async def read() -> str:
        return var.get()

    async def spawn_as(value: str) -> str:
        var.set(value)
        job = owner.spawn(read(), value)
        assert job is not None
        return await job.result()

    assert await fan_out([spawn_as("first"), spawn_as("second")]) == ["first", "second"]
    assert await spawn_as("later") == "later"
    await owner.aclose()


async def test_start_returns_when_the_task_is_ready() -> None:
    owner = TaskOwner("t", grace_s=0)
    steps: list[str] = []

    async def serve(port: int, *, task_status: Any) -> None:
        await asyncio.sleep(0.2)  # binding
        steps.append("ready")
        task_status.started(port)
        await asyncio.sleep(100)

    assert await owner.start(serve, 7, name="serve") == 7
    assert steps == ["ready"] and len(owner) == 1  # still running, owned

    async def broken(*, task_status: Any) -> None:
        raise RefusedError(Code.BAD_REQUEST, "cannot bind")

    with pytest.raises(RefusedError):
        await owner.start(broken, name="broken")
    await owner.aclose()
    assert len(owner) == 0
