"""Guard: shipped code starts tasks only through an AnyIO task group or popmq.lifecycle.TaskOwner.

One task-group library, AnyIO: no ``asyncio.TaskGroup`` (it wraps a body's own error in an
ExceptionGroup and ignores cancel scopes). No ``asyncio.gather`` (use popmq.lifecycle.fan_out: a
failure cancels the siblings) and no bare ``asyncio.create_task`` / ``loop.create_task`` /
``ensure_future`` outside the owner type."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ["broker", "proxy", "popmq", "pyspark_popmq"]
# The one place that may create a raw task: the owner's host task.
OWNER = ROOT / "popmq" / "lifecycle.py"
GATHER = re.compile(r"\basyncio\.gather\(")
ASYNCIO_GROUP = re.compile(r"\bTaskGroup\(|\basyncio\.TaskGroup\b")
# Bare task creation: asyncio.create_task(, loop.create_task(, get_running_loop().create_task(,
# ensure_future(.
BARE = re.compile(r"(\basyncio\.create_task\(|\bloop\(?\)?\.create_task\(|"
                  r"get_running_loop\(\)\.create_task\(|\bensure_future\()")  # fmt: skip


def _shipped_sources() -> list[Path]:
    files = []
    for top in SHIPPED:
        for path in (ROOT / top).rglob("*.py"):
            if "pb" in path.relative_to(ROOT).parts[:2] and path.name.endswith(
                ("_pb2.py", "_grpc.py")
            ):
                continue
            files.append(path)
    return files


def _hits(pattern: re.Pattern[str], skip: Path | None = None) -> list[str]:
    found = []
    for path in _shipped_sources():
        if path == skip:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line.split("#", 1)[0]):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_the_guard_sees_the_shipped_code() -> None:
    sources = _shipped_sources()
    assert len(sources) > 100
    assert OWNER in sources
    assert _hits(BARE) != []  # the owner's host task itself is found


def test_no_asyncio_gather_in_shipped_code() -> None:
    assert _hits(GATHER) == []


def test_no_bare_task_creation_outside_the_owner() -> None:
    assert _hits(BARE, skip=OWNER) == []


def test_one_task_group_library_anyio() -> None:
    assert _hits(ASYNCIO_GROUP) == []
