"""A real `popmq broker` child process on 127.0.0.1, for process-level tests (chaos suite).

``BrokerProcess.start()`` waits for the startup line and reads the bound gRPC port from it,
and the metrics port from the log when ``metrics=True``; ``kill()`` is a kill -9."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"^popmq broker (\S+) listening on (\S+):(\d+)$")
METRICS = re.compile(rb"metrics on http://127\.0\.0\.1:(\d+)/metrics")
STARTUP_TIMEOUT_S = 90.0  # only bounds a failure: a loaded CI machine starts slowly


class BrokerProcess:
    """One `python -m popmq broker` child; stderr goes to ``log_path`` (kept for failures)."""

    def __init__(self, data_dir: Path, name: str, log_path: Path, *extra: str,
                 flush: str = "sync", metrics: bool = False) -> None:  # fmt: skip
        self.data_dir, self.name, self.log_path = data_dir, name, log_path
        self.extra, self.flush, self.metrics = list(extra), flush, metrics
        self.proc: asyncio.subprocess.Process | None = None
        self.address = ""
        self.metrics_port = 0

    async def start(self) -> None:
        args = [
            sys.executable, "-m", "popmq", "broker", "--name", self.name,
            "--host", "127.0.0.1", "--port", "0", "--data-dir", str(self.data_dir),
            "--flush", self.flush, *self.extra,
        ]  # fmt: skip
        if self.metrics:
            args += ["--metrics-port", "0"]
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *args, cwd=REPO_ROOT, stdout=asyncio.subprocess.PIPE, stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), STARTUP_TIMEOUT_S)
        except TimeoutError:
            await self.kill()
            raise AssertionError(f"broker did not start:\n{self.log_text()}") from None
        match = LISTENING.match(line.decode().strip())
        assert match, f"unexpected first line {line!r}:\n{self.log_text()}"
        self.address = f"{match.group(2)}:{match.group(3)}"
        if self.metrics:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                found = METRICS.search(log.read())
            assert found, f"no metrics port in the log:\n{self.log_text()}"
            self.metrics_port = int(found.group(1))

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def scrape(self) -> str:
        """The /metrics text (blocking; call from a thread or between awaits)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode()

    async def terminate(self, timeout_s: float = 10.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), timeout_s)

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
