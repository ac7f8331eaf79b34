"""Count event-loop work in every Python process started with this directory on PYTHONPATH.

Bench-only instrument (docs/benchmarks.md, "Loop iterations and hops per message"): with
POPMQ_HOPCOUNT_DIR set, each process writes ``<pid>.json`` there every half second: its argv
and how many loop iterations, callbacks run, call_soon / call_soon_threadsafe calls, tasks
created and executor jobs it has made so far. The counters are plain ints bumped from wrapped
asyncio methods (C futures and tasks look ``call_soon`` up on the loop, so they are counted);
POPMQ_HOPCOUNT_DETAIL=1 adds counts of tasks by coroutine and of callbacks by function.

    POPMQ_HOPCOUNT_DIR=/tmp/hc PYTHONPATH=scripts/hopcount \
        popmq bench e2e --messages 20000 --mode proxy floor

The bench's server processes inherit the environment, so `popmq serve` and the floor are
counted alike (the load generator too; tell them apart by argv).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time

_DIR = os.environ.get("POPMQ_HOPCOUNT_DIR")

if _DIR:
    counts = {
        "run_once": 0,
        "handles_run": 0,
        "call_soon": 0,
        "call_soon_threadsafe": 0,
        "create_task": 0,
        "run_in_executor": 0,
    }
    base = asyncio.BaseEventLoop

    def _wrap(name: str, key: str) -> None:
        original = getattr(base, name)

        def wrapper(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            counts[key] += 1
            return original(self, *args, **kwargs)

        setattr(base, name, wrapper)

    original_run_once = base._run_once  # type: ignore[attr-defined]

    def run_once(self):  # type: ignore[no-untyped-def]
        counts["run_once"] += 1
        original_run_once(self)

    base._run_once = run_once  # type: ignore[attr-defined]
    original_handle_run = asyncio.events.Handle._run

    def handle_run(self):  # type: ignore[no-untyped-def]
        counts["handles_run"] += 1
        return original_handle_run(self)

    asyncio.events.Handle._run = handle_run  # type: ignore[method-assign]
    _wrap("call_soon_threadsafe", "call_soon_threadsafe")
    # By what they run, when POPMQ_HOPCOUNT_DETAIL is set: which coroutines get a task of
    # their own, which callbacks are scheduled.
    detail = bool(os.environ.get("POPMQ_HOPCOUNT_DETAIL"))
    tasks_by: dict[str, int] = {}
    soon_by: dict[str, int] = {}

    def _name(obj) -> str:  # type: ignore[no-untyped-def]
        name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
        owner = getattr(obj, "__self__", None)
        if owner is not None and not isinstance(owner, type):
            name = f"{type(owner).__qualname__}.{name}"
        return str(name)

    original_create_task = base.create_task

    def create_task(self, coro, *args, **kwargs):  # type: ignore[no-untyped-def]
        counts["create_task"] += 1
        if detail:
            key = _name(coro)
            if key.endswith(("_hosting", "_run_coro")):  # which owner or group: by task name
                key += f" {str(kwargs.get('name'))[:60]}"
            tasks_by[key] = tasks_by.get(key, 0) + 1
        return original_create_task(self, coro, *args, **kwargs)

    base.create_task = create_task  # type: ignore[method-assign]
    original_call_soon = base.call_soon

    def call_soon(self, callback, *args, **kwargs):  # type: ignore[no-untyped-def]
        counts["call_soon"] += 1
        if detail:
            key = _name(callback)
            soon_by[key] = soon_by.get(key, 0) + 1
        return original_call_soon(self, callback, *args, **kwargs)

    base.call_soon = call_soon  # type: ignore[method-assign]
    _wrap("run_in_executor", "run_in_executor")

    path = os.path.join(_DIR, f"{os.getpid()}.json")

    def _dump() -> None:
        while True:
            time.sleep(0.5)
            tmp = path + ".tmp"
            with open(tmp, "w") as out:
                json.dump(
                    {
                        "argv": sys.argv,
                        "t": time.time(),
                        **counts,
                        "tasks_by": dict(tasks_by),
                        "soon_by": dict(soon_by),
                    },
                    out,
                )
            os.replace(tmp, path)

    threading.Thread(target=_dump, daemon=True, name="hopcount").start()
