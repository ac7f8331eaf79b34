"""Real popmq processes for the chaos suite: start, read the announced address, count
descriptors, scrape /metrics, kill. Everything on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import re
import resource
import socket
import sys
import urllib.request
from pathlib import Path

from support.broker_process import kill_now

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0  # generous: HA tests start several processes at once
_ADDRESS = re.compile(r"listening on (\S+):(\d+)$")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PopmqProcess:
    """One `python -m popmq ...` child; stderr goes to a log file (read on failures)."""

    def __init__(self, args: list[str], log_path: Path, *, max_fds: int | None = None) -> None:
        self.args, self.log_path, self.max_fds = args, log_path, max_fds
        self.proc: asyncio.subprocess.Process | None = None
        self.address = ""

    def _limit_fds(self) -> None:  # runs in the child before exec
        if self.max_fds is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.max_fds, self.max_fds))

    async def start(self) -> PopmqProcess:
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "popmq", *self.args, cwd=REPO_ROOT,
                stdout=asyncio.subprocess.PIPE, stderr=log,
                # No Python in the child unless needed: a fork that runs Python while the test
                # holds gRPC channels can crash the child (SIGSEGV before exec); without
                # preexec_fn, subprocess spawns without running any.
                preexec_fn=self._limit_fds if self.max_fds is not None else None,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        try:
            return await self._await_address()
        except BaseException:
            # A timeout (pytest-timeout, a cancel) or an exit while it starts must not leave
            # the child running: kill it by PID at once, without awaiting, then re-raise.
            kill_now(self.proc)
            raise

    async def _await_address(self) -> PopmqProcess:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            try:
                line = await asyncio.wait_for(self.proc.stdout.readline(), STARTUP_TIMEOUT_S)
            except TimeoutError:
                raise AssertionError(f"did not start:\n{self.log()}") from None
            if not line:
                raise AssertionError(f"exited at start:\n{self.log()}")
            match = _ADDRESS.search(line.decode().strip())
            if match:
                self.address = f"{match.group(1)}:{match.group(2)}"
                return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def open_fds(self) -> int:
        assert self.proc is not None
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    async def terminate(self, timeout_s: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.terminate()
        return await asyncio.wait_for(self.proc.wait(), timeout_s)


def broker_args(name: str, data_dir: Path, metrics_port: int, *sets: str) -> list[str]:
    args = ["broker", "--name", name, "--host", "127.0.0.1", "--port", "0",
            "--data-dir", str(data_dir),
            "--set", f"broker.metrics_port={metrics_port}"]  # fmt: skip
    for item in sets:
        args += ["--set", item]
    return args


def proxy_args(brokers: dict[str, str], metrics_port: int, *sets: str) -> list[str]:
    args = ["proxy", "--host", "127.0.0.1", "--port", "0", "--metrics-port", str(metrics_port)]
    for name, address in brokers.items():
        args += ["--broker", f"{name}={address}"]
    for item in sets:
        args += ["--set", item]
    return args


def scrape(port: int, timeout_s: float = 10.0) -> str:
    """GET /metrics (blocking: call through asyncio.to_thread)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as reply:
        assert reply.status == 200
        return reply.read().decode()


def sample(text: str, name: str) -> float:
    """The sum of a metric's samples in a Prometheus text page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total
