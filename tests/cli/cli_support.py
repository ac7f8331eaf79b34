"""Running `popmq` as a user would, from the tests of tests/cli."""

from __future__ import annotations

import subprocess
import sys

from support.official_clients import REPO


def popmq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "popmq", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
