"""The asyncio event loop the servers run on: the stdlib's, or uvloop's (libuv in C).

Standard library only here (uvloop is imported when chosen), so the bench's do-nothing floor
server can use it without pulling the config model in and still run on the same loop as
`popmq serve`. grpc.aio and AnyIO's asyncio backend run on either loop.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar, get_args

EventLoopChoice = Literal["auto", "asyncio", "uvloop"]
EVENT_LOOP_CHOICES: tuple[str, ...] = get_args(EventLoopChoice)
# Read by `popmq.bench.floor` too, so a bench run's servers all share one loop choice.
EVENT_LOOP_ENV = "POPMQ_SERVER__EVENT_LOOP"

T = TypeVar("T")


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve(choice: str) -> Literal["asyncio", "uvloop"]:
    """auto: uvloop when it is installed (it is a dependency), else the stdlib loop."""
    if choice not in EVENT_LOOP_CHOICES:
        raise ValueError(f"event loop {choice!r}: expected one of {', '.join(EVENT_LOOP_CHOICES)}")
    if choice == "auto":
        return "uvloop" if uvloop_installed() else "asyncio"
    if choice == "uvloop" and not uvloop_installed():
        raise ValueError("event loop uvloop: the uvloop package is not installed")
    return "uvloop" if choice == "uvloop" else "asyncio"


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A factory for asyncio.Runner (None: the stdlib's default loop)."""
    if resolve(choice) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


def run(main: Coroutine[Any, Any, T], choice: str) -> T:
    """asyncio.run(main) on the chosen loop (asyncio.run takes no loop factory before 3.12)."""
    try:
        factory = loop_factory(choice)
    except BaseException:
        main.close()  # never awaited: no "coroutine was never awaited" warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
