"""Committed consumer offsets per (group, topic, queue id): the ones in memory, whether they
changed since they were last written, and the ones last written (a crash falls back to those).
The checkpoint writes them to consumer_offsets.json (durability.py)."""

from __future__ import annotations

from typing import Any

from popmq.broker.contract.errors import Code, RefusedError

OffsetKey = tuple[str, str, int]  # (group, topic, queue id)


class ConsumerOffsets:
    def __init__(self) -> None:
        self._offsets: dict[OffsetKey, int] = {}
        self.dirty = False  # changed since the last snapshot was taken for a write
        self._durable: dict[OffsetKey, int] = {}

    def load(self, rows: list[list[Any]] | None) -> None:
        """Rows of [group, topic, queue id, offset] as consumer_offsets.json holds them."""
        for group, topic, queue_id, offset in rows or []:
            self._offsets[(group, topic, queue_id)] = offset

    def get(self, key: OffsetKey) -> int:
        return self._offsets.get(key, -1)

    def set(self, key: OffsetKey, offset: int) -> None:
        if not isinstance(offset, int) or offset < 0:
            raise RefusedError(Code.BAD_REQUEST, f"consumer offset must be >= 0, got {offset!r}")
        if self._offsets.get(key) != offset:
            self._offsets[key] = offset
            self.dirty = True

    def keys(self) -> list[OffsetKey]:
        return list(self._offsets)

    def durable(self, key: OffsetKey) -> int:
        """The offset as last written to disk (-1 if never)."""
        return self._durable.get(key, -1)

    def delete_group(self, group: str) -> int:
        keys = [key for key in self._offsets if key[0] == group]
        for key in keys:
            del self._offsets[key]
        if keys:
            self.dirty = True
        return len(keys)

    def delete_topic(self, topic: str) -> None:
        for key in [key for key in self._offsets if key[1] == topic]:
            del self._offsets[key]
            self.dirty = True

    def snapshot(self) -> list[list[Any]]:
        return [[g, t, q, o] for (g, t, q), o in self._offsets.items()]

    def written(self, rows: list[list[Any]]) -> None:
        """rows (a snapshot) are on disk now."""
        self._durable = {(g, t, q): o for g, t, q, o in rows}
