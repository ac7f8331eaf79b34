"""A checkpoint: the batch of messages one pop handed out from one queue, and their fate."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class EntryState(enum.IntEnum):
    PENDING = 0  # handed out, invisible, not acked
    ACKED = 1
    SUPERSEDED = 2  # change_invisible_time moved it to a newer checkpoint
    REVIVED = 3  # written to the retry topic or the DLQ
    RELEASED = 4  # FIFO: back in its queue for redelivery in place
    DROPPED = 5  # the message is gone from the store (retention)
    # Handed back undelivered (no consumer received it): back in its queue like RELEASED,
    # with no delivery attempt counted; its own state so a replayed journal counts none either.
    HANDED_BACK = 6


# States after which the offset is finished for the group (the consumer offset may pass it).
DONE_STATES = frozenset({EntryState.ACKED, EntryState.REVIVED, EntryState.DROPPED})


@dataclass(eq=False, slots=True)
class Checkpoint:
    ck_id: int
    group: str
    topic: str
    queue_id: int
    pop_time_ms: int
    invisible_until_ms: int
    fifo: bool
    offsets: list[int]
    attempts: list[int]  # reconsume count of each message when it was handed out
    states: bytearray = field(default_factory=bytearray)
    pending: int = 0
    spilled: bool = False  # written to the pop journal
    created_ms: int = 0

    def __post_init__(self) -> None:
        if not self.states:
            self.states = bytearray(len(self.offsets))
        self.pending = sum(1 for state in self.states if state == EntryState.PENDING)

    @property
    def queue_key(self) -> tuple[str, str, int]:
        return (self.group, self.topic, self.queue_id)

    def state(self, index: int) -> EntryState:
        return EntryState(self.states[index])

    def set_state(self, index: int, state: EntryState) -> None:
        if self.states[index] == EntryState.PENDING and state != EntryState.PENDING:
            self.pending -= 1
        self.states[index] = state

    def pending_indexes(self) -> list[int]:
        return [i for i, state in enumerate(self.states) if state == EntryState.PENDING]

    # -- journal form ---------------------------------------------------------------------
    def to_record(self) -> dict[str, Any]:
        return {
            "k": "ck",
            "id": self.ck_id,
            "g": self.group,
            "t": self.topic,
            "q": self.queue_id,
            "pt": self.pop_time_ms,
            "iu": self.invisible_until_ms,
            "f": int(self.fifo),
            "o": self.offsets,
            "a": self.attempts,
            "s": list(self.states),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Checkpoint:
        return cls(
            ck_id=int(record["id"]),
            group=str(record["g"]),
            topic=str(record["t"]),
            queue_id=int(record["q"]),
            pop_time_ms=int(record["pt"]),
            invisible_until_ms=int(record["iu"]),
            fifo=bool(record["f"]),
            offsets=[int(o) for o in record["o"]],
            attempts=[int(a) for a in record["a"]],
            states=bytearray(int(s) for s in record["s"]),
            spilled=True,
        )
