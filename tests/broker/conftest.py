"""Fixtures shared by the broker tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from popmq.broker.store import MessageStore

from popmq.clock import Clock
from popmq.config import StoreConfig

StoreFactory = Callable[..., MessageStore]


@pytest.fixture
async def store_factory(tmp_path: Path) -> AsyncIterator[StoreFactory]:
    """open_store(subdir="store", clock=None, index_entries_per_file=..., timer=None,
    retention_interval_s=..., **StoreConfig fields)
    -> an opened MessageStore; every store still open is closed at the end."""
    opened: list[MessageStore] = []

    def open_store(
        subdir: str = "store",
        clock: Callable[[], int] | None = None,
        index_entries_per_file: int = 300_000,
        timer: Clock | None = None,
        retention_interval_s: float = 10.0,
        **config: Any,
    ) -> MessageStore:
        kwargs: dict[str, Any] = {
            "index_entries_per_file": index_entries_per_file,
            "retention_interval_s": retention_interval_s,
        }
        if clock is not None:
            kwargs["clock"] = clock
        if timer is not None:
            kwargs["timer"] = timer
        store = MessageStore(tmp_path / subdir, "broker-t", StoreConfig(**config), **kwargs)
        store.open()
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        await store.aclose()
