"""TaskOwner, the one owner of background tasks, and fan_out, the one concurrent fan-out.

Both run on AnyIO task groups (on its asyncio backend, where grpc.aio lives).

A long-lived component keeps its background work in one ``TaskOwner`` and closes it with
``aclose()`` (or ``async with``). One shutdown policy for all of them: refuse new work, let
running tasks finish for up to ``grace_s``, then cancel what is left and wait until it is gone.
Nothing outlives its owner.

The owner's task group lives in a small host task of its own, started on the first spawn and
gone again once the owner is idle: owners are made in one task and closed in another (fixtures,
signal handlers), which a task group entered directly by the component would not allow.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from contextvars import Context, copy_context
from typing import Any, Generic, Self, TypeVar

import anyio
from anyio.abc import TaskGroup

log = logging.getLogger(__name__)

T = TypeVar("T")


class Job(Generic[T]):
    """One task of a TaskOwner: cancel it, wait for it, read its result."""

    __slots__ = ("_cancelled", "_done", "_error", "_result", "_scope", "_task_id", "log_errors",
                 "name")  # fmt: skip

    def __init__(self, name: str, log_errors: bool) -> None:
        self.name = name
        self.log_errors = log_errors
        self._scope = anyio.CancelScope()
        self._done = anyio.Event()
        self._result: T | None = None
        self._error: BaseException | None = None
        self._cancelled = False
        self._task_id: int | None = None

    def cancel(self) -> None:
        self._scope.cancel()

    def done(self) -> bool:
        return self._done.is_set()

    def cancelled(self) -> bool:
        return self._cancelled

    def is_current(self) -> bool:
        """True inside the job's own task."""
        return self._task_id is not None and self._task_id == anyio.get_current_task().id

    async def wait(self) -> None:
        """Until the job has ended (by result, error or cancellation); never raises its error."""
        await self._done.wait()

    async def result(self) -> T:
        """The job's result; its error is raised, a cancelled job raises CancelledError."""
        await self._done.wait()
        if self._error is not None:
            raise self._error
        if self._cancelled:
            raise asyncio.CancelledError(f"job {self.name} was cancelled")
        return self._result  # type: ignore[return-value]


class AsyncClosing(abc.ABC):
    """``async with`` for a component closed by ``aclose()`` (the one lifecycle vocabulary)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Refuse new work, drain within a bound, then cancel what is left."""


class TaskStatus:
    """What ``TaskOwner.start`` hands its task: call ``started()`` once it is ready."""

    def __init__(self) -> None:
        self.ready = anyio.Event()
        self.called = False
        self.value: Any = None

    def started(self, value: Any = None) -> None:
        self.called = True
        self.value = value
        self.ready.set()


class TaskOwner:
    """Owns a task group; ``spawn`` adds work, ``aclose`` refuses, drains (bounded), cancels."""

    def __init__(self, name: str, *, grace_s: float = 2.0) -> None:
        self.name = name
        self.grace_s = grace_s
        # A job waiting for the host task keeps its coroutine and the spawner's context.
        self._jobs: dict[Job[Any], tuple[Coroutine[Any, Any, Any], Context] | None] = {}
        self._group: TaskGroup | None = None
        self._host: asyncio.Task[None] | None = None
        self._idle: anyio.Event | None = None
        self._closing = False
        self._draining = False

    async def __aenter__(self) -> TaskOwner:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __len__(self) -> int:
        """Tasks not yet ended (running or about to start)."""
        return len(self._jobs)

    @property
    def closing(self) -> bool:
        return self._closing

    def refuses(self) -> bool:
        """Whether ``spawn`` would refuse new work now (what work done inline asks first)."""
        return self._closing and not (self._draining and self._inside())

    def spawn(
        self, coro: Coroutine[Any, Any, T], name: str, *, log_errors: bool = True
    ) -> Job[T] | None:
        """Run coro in the owner's task group; None (and coro closed) once the owner closes,
        except for follow-up work its own tasks spawn while they drain (a pop's release).
        A failing task is logged (unless log_errors is False) and never ends its siblings."""
        if self.refuses():
            coro.close()
            return None
        job: Job[T] = Job(name, log_errors)
        if self._group is not None:
            self._jobs[job] = None
            self._group.start_soon(self._run, job, coro, name=name)
        else:
            # Started by the host task once its group is open, in the spawner's context (the
            # trace span and other context variables go with the work, as with create_task).
            self._jobs[job] = (coro, copy_context())
            if self._host is None:
                loop = asyncio.get_running_loop()
                self._host = loop.create_task(self._hosting(), name=f"owner:{self.name}")
        return job

    async def _hosting(self) -> None:
        try:
            async with anyio.create_task_group() as group:
                self._group = group
                for job, waiting in list(self._jobs.items()):
                    if waiting is not None:
                        self._jobs[job] = None
                        coro, context = waiting
                        context.run(
                            functools.partial(group.start_soon, name=job.name), self._run, job, coro
                        )
                while self._jobs:
                    self._idle = anyio.Event()
                    await self._idle.wait()
                self._group = None  # spawns from here on wait for the next host task
        finally:
            self._group = None
            self._host = None
            if any(waiting is not None for waiting in self._jobs.values()):
                self._host = asyncio.get_running_loop().create_task(
                    self._hosting(), name=f"owner:{self.name}"
                )

    async def _run(self, job: Job[Any], coro: Coroutine[Any, Any, Any]) -> None:
        job._task_id = anyio.get_current_task().id
        finished = False
        try:
            with job._scope:
                if job._scope.cancel_called:
                    coro.close()  # cancelled before it started: it never runs
                else:
                    job._result = await coro
                    finished = True
        except Exception as exc:
            job._error = exc
            finished = True
            if job.log_errors:
                log.warning("%s: task %s failed: %r", self.name, job.name, exc)
        finally:
            job._cancelled = not finished
            self._jobs.pop(job, None)
            job._done.set()
            if not self._jobs and self._idle is not None:
                self._idle.set()

    def _inside(self) -> bool:
        """True when called from one of this owner's tasks."""
        return any(job.is_current() for job in self._jobs)

    async def start(
        self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any, name: str
    ) -> Any:
        """Spawn ``func(*args, task_status=...)`` and return once it calls
        ``task_status.started(value)`` (that value); its error if it ends before that."""
        status = TaskStatus()
        job = self.spawn(func(*args, task_status=status), name, log_errors=False)
        if job is None:
            raise RuntimeError(f"{self.name} is closed: cannot start {name}")

        async def ended() -> None:
            await job.wait()
            status.ready.set()

        async with anyio.create_task_group() as group:
            group.start_soon(ended)
            await status.ready.wait()
            group.cancel_scope.cancel()
        if not status.called:  # the task ended before it was ready
            await job.result()  # raises its error, or CancelledError
            raise RuntimeError(f"{name} ended before it was ready")
        job.log_errors = True  # from here on it is background work like any other
        return status.value

    async def wait_idle(self) -> None:
        """Until every task has ended."""
        while self._jobs:
            await next(iter(self._jobs))._done.wait()

    async def aclose(self, grace_s: float | None = None) -> None:
        """Refuse new work, let running tasks finish for up to grace_s, then cancel the rest
        and wait until every task and the host task are gone."""
        self._closing = True
        grace = self.grace_s if grace_s is None else grace_s
        if self._jobs and grace > 0:
            self._draining = True
            with anyio.move_on_after(grace):
                await self.wait_idle()
            self._draining = False
        for job in list(self._jobs):
            job.cancel()
        with anyio.CancelScope(shield=True):
            await self.wait_idle()
            if self._host is not None:
                await asyncio.wait([self._host])


def _first_error(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        errors = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (errors or list(exc.exceptions))[0]
    return exc


async def fan_out(calls: Iterable[Awaitable[T]], *, return_exceptions: bool = False) -> list[Any]:
    """Await calls concurrently in a task group; results in call order.

    Without return_exceptions the first failure cancels the siblings and is raised as itself
    (not as an ExceptionGroup), so callers keep catching the errors they know. With it, each
    failure (an Exception) takes its call's place in the results and the siblings go on.
    """
    items = list(calls)
    results: list[Any] = [None] * len(items)

    async def one(index: int, call: Awaitable[T]) -> None:
        try:
            results[index] = await call
        except Exception as exc:
            if not return_exceptions:
                raise
            results[index] = exc

    try:
        async with anyio.create_task_group() as group:
            for index, call in enumerate(items):
                group.start_soon(one, index, call)
    except BaseExceptionGroup as errors:
        raise _first_error(errors) from None
    return results
