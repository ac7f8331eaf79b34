"""Run `popmq serve` as a child process on loopback, for tests and benchmarks.

    with LocalServer(tmp_path, brokers=2) as server:
        server.create_topic("orders", queues=2)
        Client(server.endpoint) ...

The server is a real process (embedded brokers, real files); stop() sends SIGTERM and waits,
kill() is kill -9.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import grpc

from popmq.broker.contract.errors import Code
from popmq.client.errors import ProxyError

_LISTENING = re.compile(r"popmq proxy listening on (\S+):(\d+)")


class LocalServer:
    def __init__(
        self,
        data_dir: Path | str,
        brokers: int = 2,
        settings: Mapping[str, object] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.brokers = brokers
        self.settings = dict(settings or {})
        self.python = python
        self.endpoint = ""
        self.log_path = self.data_dir / "server.log"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def start(self, timeout_s: float = 30.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [self.python, "-m", "popmq", "serve", "--host", "127.0.0.1", "--port", "0"]
        command += ["--brokers", str(self.brokers), "--data-dir", str(self.data_dir)]
        for key, value in self.settings.items():
            command += ["--set", f"{key}={value}"]
        log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL
        )
        log.close()
        self.endpoint = self._await_address(timeout_s)
        return self.endpoint

    def _await_address(self, timeout_s: float) -> str:
        assert self._process is not None and self._process.stdout is not None
        found: list[str] = []
        stdout = self._process.stdout

        def scan() -> None:
            # Keep draining stdout after the address line so the child never blocks on it.
            for raw in stdout:
                match = _LISTENING.search(raw.decode(errors="replace"))
                if match and not found:
                    found.append(f"{match.group(1)}:{match.group(2)}")

        threading.Thread(target=scan, daemon=True, name="popmq-serve-stdout").start()
        deadline = time.monotonic() + timeout_s
        while not found:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"popmq serve exited with {self._process.returncode}: {self._log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"popmq serve did not start in {timeout_s}s: {self._log_tail()}")
            time.sleep(0.05)
        return found[0]

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """kill -9: no clean shutdown."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()

    def create_topic(self, name: str, queues: int = 2) -> None:
        """Create a topic on every broker through the proxy's admin API."""
        from popmq.pb.admin.v1 import admin_pb2, admin_pb2_grpc

        with grpc.insecure_channel(self.endpoint) as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            response = stub.CreateTopic(
                admin_pb2.CreateTopicRequest(name=name, queue_count=queues), timeout=10
            )
        if response.status.code != Code.OK:
            raise ProxyError(response.status.code, response.status.message, "CreateTopic")
