"""Giving memory back to the system after a spike of large requests (glibc's ``malloc_trim``).

A large request passes through many buffers on its way (grpc's receive buffer, its slices as
bytes, the decoded protobuf, the link's frames); once they are freed, glibc keeps most of that
memory in its heaps and arenas instead of returning it, so a process's RSS stays near its
highest point long after a spike (docs/operations.md, "Memory after a spike"). ``malloc_trim``
hands the free pages back. It walks every arena (a few ms for a few hundred MB), so it runs
only when a memory budget drains after at least ``TRIM_AFTER_BYTES`` went through it, at most
once per ``TRIM_INTERVAL_S``, and once more ``TRIM_SETTLE_S`` later: grpc frees some of a
request's buffers only when its call ends, which on a loaded machine can come after the first
trim. It does not shrink the top of an arena other than the main one's (what grpc's threads
freed last stays there, up to glibc's trim threshold). Elsewhere than glibc (musl, macOS) it
does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# Trim once this much went through a budget since the last trim (small requests reuse what
# they free; trimming after each would only cost time).
TRIM_AFTER_BYTES = 32 * 1024 * 1024
TRIM_INTERVAL_S = 1.0
TRIM_DELAY_S = 0.2
# One more trim this long after a spike's trim, for what was freed after it.
TRIM_SETTLE_S = 2.0


def _load_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_malloc_trim = _load_trim()


def trim() -> bool:
    """Return the free pages of every arena to the system; True if any were."""
    if _malloc_trim is None:
        return False
    return bool(_malloc_trim(0))


class Trimmer:
    """Counts bytes released; trims ``delay_s`` after its owner drained past enough of them
    (the request that was just released is freed by grpc after its handler returns, so a trim
    at the release itself would miss it), or once ``interval_s`` since the last trim passed;
    then once more ``settle_s`` after that trim (a settling trim, which schedules no other)."""

    def __init__(
        self,
        after_bytes: int = TRIM_AFTER_BYTES,
        interval_s: float = TRIM_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        do_trim: Callable[[], bool] = trim,
        delay_s: float = TRIM_DELAY_S,
        settle_s: float = TRIM_SETTLE_S,
    ) -> None:
        self._after_bytes = after_bytes
        self._interval_s = interval_s
        self._clock = clock
        self._trim = do_trim
        self._delay_s = delay_s
        self._settle_s = settle_s
        self._released = 0
        self._last = float("-inf")
        self._scheduled: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # where it is scheduled
        self._settling = False  # what is scheduled is a settling trim
        self.trims = 0

    def released(self, size: int, drained: bool) -> None:
        """``size`` bytes were released; ``drained``: nothing is held any more."""
        self._released += size
        if not drained or self._released < self._after_bytes:
            return
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if self._scheduled is not None and self._loop is not loop:
            # Scheduled on a loop that ended or stopped first (a process-wide trimmer serves
            # every loop of a test process): it would never run, and hold back every trim.
            if self._loop is not None and not self._loop.is_running():
                if not self._loop.is_closed():
                    self._scheduled.cancel()
                self._scheduled = None
        if loop is None:
            # No loop (a synchronous caller): trim now, if it is time and no trim is coming
            # (one scheduled on a loop is that loop's to run or cancel; it trims this too).
            if self._scheduled is None and self._clock() - self._last >= self._interval_s:
                self._run(settling=True)
            return
        if self._scheduled is not None:
            if not self._settling:
                return  # a spike's trim is already coming
            self._scheduled.cancel()  # a new spike: its own trim comes first
            self._scheduled = None
        # Within the interval of the last trim: trim once it has passed, never drop it (what
        # was freed since would otherwise stay until the next spike).
        wait = max(self._delay_s, self._last + self._interval_s - self._clock())
        self._settling, self._loop = False, loop
        self._scheduled = loop.call_later(wait, self._run, False)

    def _run(self, settling: bool) -> None:
        self._scheduled = None
        self._last = self._clock()
        self._released = 0
        self.trims += 1
        started = time.perf_counter()
        self._trim()
        log.debug(
            "malloc_trim after a drained budget: %.1f ms", (time.perf_counter() - started) * 1e3
        )
        if not settling:
            self._settling, self._loop = True, asyncio.get_running_loop()
            self._scheduled = self._loop.call_later(self._settle_s, self._run, True)
