"""Custody of messages popped for one long poll.

A pop's result is put here by the pop task's done-callback, so messages are accounted for even
when the long poll is cancelled between the broker's answer and the hand-over. Once the long
poll ends without handing them over (client gone, deadline, error), they are released: made
visible again at once instead of waiting out their invisible time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from popmq.broker.contract.port import ConsumePort
from popmq.broker.contract.types import PoppedMessage

Release = Callable[..., None]


class Custody:
    """``release(port, *args, messages)`` makes what it holds visible again. The extra
    arguments (the long poll's pop request) are kept here rather than in a closure made per
    long poll: a closure and its cells are memory each of 10,000 idle polls holds."""

    __slots__ = ("_args", "_held", "_open", "_release")  # one per held long poll

    def __init__(self, release: Release, *args: Any) -> None:
        self._release = release
        self._args = args
        # Made by the first pop that finds messages: most idle long polls never hold any.
        self._held: list[tuple[ConsumePort, list[PoppedMessage]]] | None = None
        self._open = True

    def keep(self, port: ConsumePort, messages: list[PoppedMessage]) -> None:
        if not messages:
            return
        if self._open:
            if self._held is None:
                self._held = []
            self._held.append((port, messages))
        else:
            # The long poll is over: nobody will deliver these.
            self._release(port, *self._args, messages)

    def ports(self) -> list[ConsumePort]:
        """The brokers whose messages it holds, in the order they came."""
        return list(dict.fromkeys(port for port, _ in self._held or ()))

    @property
    def count(self) -> int:
        held = self._held
        return 0 if held is None else sum(len(messages) for _, messages in held)

    def hand_over(self) -> list[PoppedMessage]:
        """Close custody and give every held message to the caller (who now owns them)."""
        self._open = False
        held, self._held = self._held, None
        return [message for _, messages in held or () for message in messages]

    def abandon(self) -> None:
        """Close custody and release everything held (and anything that still arrives)."""
        self._open = False
        held, self._held = self._held, None
        for port, messages in held or ():
            self._release(port, *self._args, messages)
