"""One browser per module (Debian's chromium through Playwright; skipped where it is absent)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from console_support import CHROMIUM


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"no {CHROMIUM} (make test installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox"], headless=True
        )
        try:
            yield launched
        finally:
            launched.close()
