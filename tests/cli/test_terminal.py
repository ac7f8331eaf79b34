"""What a person sees: `popmq` run in a real pseudo-terminal (stdout and stderr are a tty, so
rich draws tables and the live benchmark line as it would for an operator)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest
from support.official_clients import REPO, Deployment

pytestmark = pytest.mark.subprocess  # starts popmq or another process

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


def run_in_terminal(*args: str, timeout: float = 120) -> tuple[int, str]:
    """Run `popmq ARGS` on a pty (100 columns); returns (exit code, screen text without
    escape sequences)."""
    controller, terminal = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "LINES": "40", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "popmq", *args], cwd=REPO, env=env,
        stdin=terminal, stdout=terminal, stderr=terminal, close_fds=True,
    )  # fmt: skip
    os.close(terminal)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                try:
                    data = os.read(controller, 65536)
                except OSError:  # EIO: the process closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif process.poll() is not None:
                break
        code = process.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if process.poll() is None:
            process.kill()
        os.close(controller)
    raw = b"".join(chunks).decode(errors="replace")
    return code, raw


def test_admin_table_on_a_terminal(served: Deployment) -> None:
    code, raw = run_in_terminal("admin", "--endpoint", served.endpoint, "topics", "create",
                                "term-topic", "--queues", "2")  # fmt: skip
    assert code == 0, raw
    code, raw = run_in_terminal("admin", "topics", "list", "--endpoint", served.endpoint)
    screen = _ANSI.sub("", raw)
    assert code == 0, screen
    lines = [line.rstrip() for line in screen.splitlines() if line.strip()]
    header = next(line for line in lines if line.lstrip().startswith("topic"))
    assert header.split() == ["topic", "brokers", "queues", "messages"]
    assert any(set(line.strip()) == {"─"} for line in lines), screen  # rich's header rule
    row = next(line for line in lines if line.lstrip().startswith("term-topic"))
    assert row.split() == ["term-topic", "2", "4", "0"]
    assert "\x1b[" in raw  # a terminal gets styling; a pipe would not


def test_bench_shows_live_progress_then_the_table() -> None:
    code, raw = run_in_terminal(
        "--log-level", "warning", "bench", "broker", "--messages", "20000",
        "--transport", "inproc", "--flush", "async",
    )  # fmt: skip
    screen = _ANSI.sub("", raw)
    assert code == 0, screen
    # the live bars were drawn while it ran: phase, n/total messages and running msg/s
    assert re.search(r"bench broker inproc/async: (send|pop\+ack|pull)\s+\S+\s+\d+/20000", screen)
    assert re.search(r"[\d,]+ msg/s", screen), screen
    # and the final table is there, once the live line is gone
    assert re.search(r"inproc/async\s+\d+\s+\d+\s+\d+", screen), screen
