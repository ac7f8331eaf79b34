"""One call at a time per key: concurrent callers of a lookup share its outcome.

An expired cache entry asked for by many sends and receives at once (a route, a group's
config) is looked up once; its answer, or its failure, reaches every waiter. A leader that
gives up (cancelled) hands the lookup on: one of the waiters looks up again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class _Abandoned(Exception):
    """A shared lookup whose caller was cancelled: its waiters look up again."""


class SingleFlight(Generic[K, V]):
    def __init__(self) -> None:
        self._flights: dict[K, asyncio.Future[V]] = {}

    def forget(self, key: K | None = None) -> None:
        """Lookups under way (of ``key``, default all) asked what is gone (replaced ports, a
        group's settings changed or deleted): later callers do not join them (the lookups
        themselves finish for their own callers)."""
        if key is None:
            self._flights.clear()
        else:
            self._flights.pop(key, None)

    async def run(
        self, key: K, cached: Callable[[], V | None], look_up: Callable[[], Awaitable[V]]
    ) -> V:
        """``cached()`` if it has an answer, else the outcome of the one ``look_up()`` under
        way for ``key``, started here if none is."""
        while True:
            hit = cached()
            if hit is not None:
                return hit
            flight = self._flights.get(key)
            if flight is None:
                break
            try:
                # Shielded: one waiter cancelled does not cancel the lookup for the others.
                return await asyncio.shield(flight)
            except _Abandoned:
                continue  # its caller was cancelled: look up anew (one waiter leads again)
        flight = self._flights[key] = asyncio.get_running_loop().create_future()
        try:
            value = await look_up()
        except Exception as exc:
            flight.set_exception(exc)
            raise
        except BaseException:
            flight.set_exception(_Abandoned())
            raise
        else:
            flight.set_result(value)
            return value
        finally:
            if self._flights.get(key) is flight:
                del self._flights[key]
            if flight.done() and not flight.cancelled():
                flight.exception()  # read here: no "never retrieved" when nobody waited
