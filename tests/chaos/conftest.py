"""The chaos suite: real `popmq broker` / `popmq proxy` processes on 127.0.0.1 under faults
and floods, with bounded load. Every test here is marked ``chaos`` (run in `make test`;
skip locally with ``-m "not chaos"``)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/chaos/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.chaos)
