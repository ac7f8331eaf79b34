"""How many examples a property test (hypothesis) tries: its full count in `make test`, a
quarter of it in `make check`, the fast inner loop (which sets QUICK_PROPERTIES=1). CI runs
`make test`, so every property still gets its full count there."""

from __future__ import annotations

import os

QUICK = os.environ.get("QUICK_PROPERTIES") == "1"


def examples(full: int) -> int:
    return max(20, full // 4) if QUICK else full
