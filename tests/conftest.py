"""Suite-wide rules. ``make check`` runs ``-m "not subprocess and not wallclock"``: the tests
that start no other process (popmq servers, official clients, Spark's JVM, the CLI) and do not
measure real time. So that selection stays honest, a test not marked ``subprocess`` that starts
one (in the test or in any fixture it sets up) fails at once and names the marker."""

from __future__ import annotations

import subprocess
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# hypothesis' too_slow check times the generation of inputs on the wall clock: on a loaded 2-core
# VM it fails a property test that checks nothing wrong (seen: test_sql92_fuzz at load 40). The
# properties themselves keep their examples and assertions.
settings.register_profile("popmq", suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("popmq")

_HERE = Path(__file__).parent
# Whole suites whose every test drives real processes.
_SUBPROCESS_SUITES = tuple(_HERE / name for name in ("official", "chaos", "spark"))
_REAL_EXECUTE_CHILD = subprocess.Popen._execute_child  # type: ignore[attr-defined]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        if any(suite in path.parents for suite in _SUBPROCESS_SUITES):
            item.add_marker(pytest.mark.subprocess)
    # Longest first: with `--no-loadscope-reorder` (make check) pytest-xdist hands out files in
    # this order, so a slow file collected last would run alone at the end while the other
    # worker idles. Files with a test marked `slow` go first; the sort is stable.
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None]:
    if item.get_closest_marker("subprocess") is not None:
        yield
        return

    def refuse(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        raise AssertionError(
            f"{item.nodeid} starts a process ({args!r}) but is not marked "
            "@pytest.mark.subprocess (make check leaves those out)"
        )

    subprocess.Popen._execute_child = refuse  # type: ignore[attr-defined]
    try:
        yield
    finally:
        subprocess.Popen._execute_child = _REAL_EXECUTE_CHILD  # type: ignore[attr-defined]
