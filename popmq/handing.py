"""Handlers that hand over: a gRPC method wrapper that only checks, without a frame of its own.

grpc.aio awaits a method's behavior only when ``inspect.iscoroutinefunction`` says it is a
coroutine function (else it runs it as a sync handler, in a thread). A wrapper that checks a
call and then awaits the behavior it wraps keeps its coroutine frame for the whole call: a held
long poll keeps one frame (250-310 B) per wrapper, 10,000 idle polls a few MiB each (docs/
benchmarks.md, "Idle polls, wave 10"). A wrapper that *returns* the inner behavior's awaitable
keeps nothing once it has returned, but is a plain function.

``hands_over(fn)`` marks such a plain function, ``fn(request, context) -> Awaitable``, so that
``inspect.iscoroutinefunction`` is true for it and grpc.aio awaits what it returns: Python
3.12's ``inspect.markcoroutinefunction``; on 3.11, which has no marker, a callable whose
``__code__`` is a coroutine's (what ``inspect`` reads of a function-like object).
``inspect.isasyncgenfunction`` stays false. Only wrappers whose whole work comes before the
inner call may hand over: nothing of theirs runs once the call ends.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

Handing = Callable[[Any, Any], Awaitable[Any]]


async def _coroutine_code(request: Any, context: Any) -> Any:
    """Never called: `_HandingFunction` borrows its code object for the coroutine flag."""


class _HandingFunction:
    """``fn`` as a function-like object whose code is flagged a coroutine's (Python 3.11)."""

    __slots__ = ("__name__", "__qualname__", "__wrapped__")
    __code__ = _coroutine_code.__code__
    __defaults__ = None
    __kwdefaults__ = None
    __annotations__: dict[str, Any] = {}

    def __init__(self, fn: Handing) -> None:
        self.__wrapped__ = fn
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__

    def __call__(self, request: Any, context: Any) -> Awaitable[Any]:
        return self.__wrapped__(request, context)


def called(fn: Handing) -> Handing:
    """What calling ``fn`` runs: the plain function of a handing function (its awaitable is
    the same), else ``fn``. A wrapper calls this instead of ``fn``: grpc.aio calls the outer
    handing function of a method, and each layer inside it then costs one call, not two."""
    return fn.__wrapped__ if isinstance(fn, _HandingFunction) else fn


def hands_over(fn: Handing) -> Handing:
    """``fn``, which returns the awaitable to await, as grpc.aio awaits a coroutine function."""
    mark = getattr(inspect, "markcoroutinefunction", None)
    if mark is not None:  # Python 3.12+
        # It marks a bound method's function and returns that, unbound: fn (a bound method is
        # a coroutine function once its function is marked) keeps its instance.
        mark(fn)
        return fn
    return _HandingFunction(fn)
