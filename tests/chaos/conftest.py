"""The chaos suite (issue 9): real processes on 127.0.0.1 under faults. Every test here is
marked ``chaos``: it runs in `make test`; skip it locally with ``-m "not chaos"``."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.chaos)
