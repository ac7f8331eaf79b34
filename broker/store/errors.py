"""Errors the store raises besides plain RefusedError."""

from __future__ import annotations

from popmq.broker.contract.errors import Code, RefusedError


class OffsetPurgedError(RefusedError):
    """The offset lies below the queue's min offset: retention deleted the message."""

    def __init__(self, topic: str, queue_id: int, offset: int, min_offset: int) -> None:
        super().__init__(
            Code.ILLEGAL_OFFSET,
            f"offset {offset} of {topic}/{queue_id} was purged by retention; "
            f"the min offset is {min_offset}",
        )
        self.min_offset = min_offset


class OffsetOutOfRangeError(RefusedError):
    """The offset lies beyond the queue's max offset (or is negative)."""

    def __init__(self, topic: str, queue_id: int, offset: int, max_offset: int) -> None:
        super().__init__(
            Code.ILLEGAL_OFFSET,
            f"offset {offset} of {topic}/{queue_id} is out of range; "
            f"valid offsets are 0 .. {max_offset} (the max offset)",
        )
        self.max_offset = max_offset
