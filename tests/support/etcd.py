"""Real etcd members on 127.0.0.1 for tests: one or three, temporary data directories, free
ports, fast elections (--heartbeat-interval 100 --election-timeout 1000), stopped by PID.

Used as::

    async with EtcdCluster.started(tmp_path, members=3) as cluster:
        cluster.endpoints        # ["http://127.0.0.1:P", ...]
        await cluster.kill(0)    # kill -9 one member
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

STARTUP_TIMEOUT_S = 60.0  # only bounds a failure: a loaded CI machine starts slowly


def etcd_binary() -> str:
    """The etcd binary, or skip (`make test` installs Debian's etcd-server where it is missing)."""
    path = shutil.which("etcd")
    if path is None:
        pytest.skip("etcd is not installed (make etcd installs Debian's etcd-server)")
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def status(self) -> dict[str, object]:
        """/v3/maintenance/status: this member's id (header.member_id) and its leader's."""
        request = urllib.request.Request(self.endpoint + "/v3/maintenance/status", data=b"{}",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=2) as reply:
            answer: dict[str, object] = json.loads(reply.read())
            return answer

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + "/health", timeout=1) as reply:
                return b'"true"' in reply.read()
        except OSError:
            return False


@dataclass
class EtcdCluster:
    members: list[EtcdMember] = field(default_factory=list)

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    @property
    def endpoint_arg(self) -> str:
        return ",".join(self.endpoints)

    def _start(self, member: EtcdMember, initial_cluster: str, state: str) -> None:
        args = [
            etcd_binary(), "--name", member.name, "--data-dir", str(member.data_dir),
            "--listen-client-urls", member.endpoint, "--advertise-client-urls", member.endpoint,
            "--listen-peer-urls", f"http://127.0.0.1:{member.peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{member.peer_port}",
            "--initial-cluster", initial_cluster, "--initial-cluster-state", state,
            "--heartbeat-interval", "100", "--election-timeout", "1000",
        ]  # fmt: skip
        with member.log_path.open("ab") as log:
            member.proc = subprocess.Popen(args, stdout=log, stderr=log)

    def _initial_cluster(self) -> str:
        return ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in self.members)

    async def wait_healthy(self, members: list[EtcdMember] | None = None) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for member in members or self.members:
            while not await asyncio.to_thread(member.healthy):
                if time.monotonic() > deadline:
                    raise AssertionError(f"etcd {member.name} not healthy:\n"
                                         + member.log_path.read_text()[-3000:])  # fmt: skip
                await asyncio.sleep(0.1)

    async def leader_index(self) -> int:
        """The index of the member that is etcd's raft leader now (asked of a live member)."""
        for index, member in enumerate(self.members):
            if member.proc is None or member.proc.poll() is not None:
                continue
            try:
                status = await asyncio.to_thread(member.status)
            except OSError:
                continue
            header = status["header"]
            assert isinstance(header, dict)
            if status["leader"] == header["member_id"]:
                return index
        raise AssertionError("no etcd member says it leads")

    def kill(self, index: int) -> None:
        """kill -9 one member (by its PID)."""
        member = self.members[index]
        if member.proc is not None and member.proc.poll() is None:
            member.proc.send_signal(signal.SIGKILL)
            member.proc.wait()

    def stop_all(self) -> None:
        for index in range(len(self.members)):
            self.kill(index)

    async def restart(self, index: int) -> None:
        member = self.members[index]
        self.kill(index)
        self._start(member, self._initial_cluster(), "existing")
        await self.wait_healthy([member])

    @classmethod
    @contextlib.asynccontextmanager
    async def started(cls, directory: Path, members: int = 1) -> AsyncIterator[EtcdCluster]:
        cluster = cls()
        for i in range(members):
            data_dir = directory / f"etcd-{i}"
            cluster.members.append(EtcdMember(f"e{i}", _free_port(), _free_port(), data_dir,
                                              directory / f"etcd-{i}.log"))  # fmt: skip
        initial = cluster._initial_cluster()
        try:
            for member in cluster.members:
                cluster._start(member, initial, "new")
            await cluster.wait_healthy()
            yield cluster
        finally:
            cluster.stop_all()
