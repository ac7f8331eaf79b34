"""Process helpers for the official-client tests: popmq servers and client sessions.

Servers are real `popmq` processes; clients are tests/official/python_session.py running in
.venv-client (the official rocketmq-python-client), driven by JSON lines.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CLIENT_PYTHON = REPO / ".venv-client" / "bin" / "python"
SESSION_SCRIPT = REPO / "tests" / "official" / "python_session.py"

# A process's start (imports, first listen) can take tens of seconds on a loaded 2-core CI
# machine: a deadline that only bounds a failure.
STARTUP_TIMEOUT_S = 90.0

# Small time scales: whole-second client durations, fast revive and retry backoff.
SERVER_SETTINGS = [
    "proxy.min_long_polling_ms=1000",
    "proxy.max_long_polling_ms=5000",
    "proxy.min_invisible_ms=1000",
    "broker.pop.min_invisible_ms=0",
    "broker.pop.revive_scan_interval_ms=50",
    "broker.pop.time_scale=0.01",
    "broker.topics.queue_count=4",
    "serve.console_port=0",  # no web console (tests/console start their own)
]


class LineReader:
    """Reads a process's stdout lines on a thread so tests can wait with a timeout."""

    def __init__(self, stream: Any) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        thread.start()

    def _pump(self, stream: Any) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no output within {timeout}s (so far: {self.seen[-5:]})") from None
        if line is None:
            raise EOFError(f"process ended (output: {self.seen[-10:]})")
        self.seen.append(line)
        return line

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            line = self.next(max(deadline - time.monotonic(), 0.01))
            match = re.search(pattern, line)
            if match:
                return match


class PopmqProcess:
    """`popmq <args>` as a subprocess; stop() sends SIGTERM and checks a clean exit."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "popmq", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.reader = LineReader(self.process.stdout)

    def wait_listening(self, what: str = "proxy", timeout: float = STARTUP_TIMEOUT_S) -> int:
        try:
            match = self.reader.wait_for(rf"popmq {what}.* listening on [\w.]+:(\d+)", timeout)
        except (TimeoutError, EOFError) as exc:
            self.stop()
            raise RuntimeError(f"{exc}\n--- log ---\n{self.log_path.read_text()[-3000:]}") from None
        return int(match.group(1))

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()
        return self.process.returncode


def serve(
    data_dir: Path,
    brokers: int = 2,
    extra: list[str] | None = None,
    extra_args: list[str] | None = None,
) -> PopmqProcess:
    args = ["serve", "--port", "0", "--brokers", str(brokers), "--data-dir", str(data_dir)]
    args += extra_args or []
    for setting in SERVER_SETTINGS + (extra or []):
        args += ["--set", setting]
    return PopmqProcess(args, data_dir.parent / f"{data_dir.name}-serve.log")


def broker(
    name: str, data_dir: Path, extra: list[str] | None = None, port: int = 0
) -> PopmqProcess:
    args = ["broker", "--name", name, "--port", str(port), "--data-dir", str(data_dir)]
    for setting in SERVER_SETTINGS + (extra or []):
        if setting.startswith("broker."):
            args += ["--set", setting]
    return PopmqProcess(args, data_dir.parent / f"{name}.log")


def cluster_proxy(
    brokers: dict[str, int], log_dir: Path, tag: str = "proxy", extra: list[str] | None = None
) -> PopmqProcess:
    args = ["proxy", "--port", "0"]
    for name, port in brokers.items():
        args += ["--broker", f"{name}=127.0.0.1:{port}"]
    for setting in SERVER_SETTINGS + (extra or []):
        args += ["--set", setting]
    return PopmqProcess(args, log_dir / f"{tag}.log")


class ClientSession:
    """One official client (Producer, SimpleConsumer or PushConsumer) in .venv-client, or
    another driver speaking the same JSON lines (`command`, e.g. the Node.js one)."""

    def __init__(
        self,
        config: dict[str, Any],
        home: Path,
        start_timeout: float = STARTUP_TIMEOUT_S,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        env = dict(os.environ, HOME=str(home), PYTHONUNBUFFERED="1", **(env or {}))
        env.pop("PYTHONPATH", None)
        self.stderr_path = home / f"session-{time.monotonic_ns()}.err"
        self._stderr = open(self.stderr_path, "w")
        self.process = subprocess.Popen(
            [*(command or [str(CLIENT_PYTHON), str(SESSION_SCRIPT)]), json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
        )
        self.reader = LineReader(self.process.stdout)
        ready = self._answer(start_timeout)
        if not ready.get("ok"):
            self.close()
            raise RuntimeError(f"client failed to start: {ready}")
        self.client_id = ready.get("client_id")

    def _answer(self, timeout: float) -> dict[str, Any]:
        try:
            return json.loads(self.reader.next(timeout))
        except (TimeoutError, EOFError) as exc:
            raise RuntimeError(f"{exc}\n--- client stderr ---\n{self._stderr_tail()}") from None

    def _stderr_tail(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text()[-3000:]

    def call(self, op: str, timeout: float = 30, **args: Any) -> dict[str, Any]:
        """Run one op; waits `timeout`, or longer for an op that runs up to its own
        `timeout_s` (receive_until, push_collect...): that plus 30 s of slack."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.process.stdin.flush()
        return self._answer(max(timeout, float(args.get("timeout_s", 0)) + 30))

    def close(self, timeout: float = 15) -> None:
        if self.process.poll() is None and self.process.stdin is not None:
            try:
                self.process.stdin.write(json.dumps({"op": "shutdown"}) + "\n")
                self.process.stdin.close()
                self.process.wait(timeout)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(5)
        self._stderr.close()


@dataclass
class Deployment:
    kind: str
    endpoint: str  # the (first) proxy clients connect to
    processes: list[PopmqProcess]
    proxies: list[str] = field(default_factory=list)  # every proxy's endpoint
    metrics_port: int | None = None  # the first proxy's Prometheus endpoint

    def stop(self) -> list[int]:
        return [p.stop() for p in reversed(self.processes)]


def start_serve(root: Path, extra: list[str] | None = None) -> Deployment:
    root.mkdir(parents=True, exist_ok=True)
    process = serve(root / "data", brokers=2, extra=extra, extra_args=["--metrics-port", "0"])
    port = process.wait_listening()
    endpoint = f"127.0.0.1:{port}"
    metrics = [re.search(r"popmq metrics on [\w.]+:(\d+)", line) for line in process.reader.seen]
    metrics_port = next(int(m.group(1)) for m in metrics if m)
    return Deployment("serve", endpoint, [process], [endpoint], metrics_port)


def start_remote_cluster(
    root: Path, proxies: int = 2, extra: list[str] | None = None
) -> Deployment:
    root.mkdir(parents=True, exist_ok=True)
    processes: list[PopmqProcess] = []
    try:
        ports = {}
        for name in ("broker-a", "broker-b"):
            process = broker(name, root / name, extra)
            processes.append(process)
            ports[name] = process.wait_listening("broker")
        endpoints = []
        for index in range(proxies):
            process = cluster_proxy(ports, root, tag=f"proxy-{index}", extra=extra)
            processes.append(process)
            endpoints.append(f"127.0.0.1:{process.wait_listening()}")
    except BaseException:
        for process in reversed(processes):
            process.stop()
        raise
    return Deployment("cluster", endpoints[0], processes, endpoints)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
