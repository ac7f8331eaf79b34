"""Real `popmq serve` and `popmq console` processes for the console tests, a browser (Debian's
chromium driven by Playwright: never a downloaded browser) and a way to fill a DLQ."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
from support.official_clients import REPO, PopmqProcess, serve

from popmq.pb.admin.v1 import admin_pb2 as a
from popmq.pb.admin.v1 import admin_pb2_grpc
from popmq.security.signature import signed_metadata

CHROMIUM = Path(os.environ.get("POPMQ_CHROMIUM", "/usr/bin/chromium"))
# Where page screenshots go: a temporary folder, or docs/img to refresh the docs' images
# (POPMQ_CONSOLE_SCREENSHOTS=docs/img).
SCREENSHOTS = os.environ.get("POPMQ_CONSOLE_SCREENSHOTS", "")
CONSOLE_LINE = r"popmq console on (http://[\d.]+:\d+)/"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def console_url(process: PopmqProcess, timeout: float = 90) -> str:
    for line in process.reader.seen:
        match = re.search(CONSOLE_LINE, line)
        if match:
            return match.group(1)
    try:
        return process.reader.wait_for(CONSOLE_LINE, timeout).group(1)
    except (TimeoutError, EOFError) as exc:
        raise RuntimeError(f"{exc}\n--- log ---\n{process.log_path.read_text()[-3000:]}") from None


def serve_with_console(
    root: Path, extra_args: list[str] | None = None
) -> tuple[PopmqProcess, str, str]:
    """`popmq serve` with its console on a free port: (process, proxy endpoint, console URL)."""
    root.mkdir(parents=True, exist_ok=True)
    process = serve(root / "data", brokers=2, extra=[f"serve.console_port={free_port()}"],
                    extra_args=extra_args)  # fmt: skip
    try:
        port = process.wait_listening()
        return process, f"127.0.0.1:{port}", console_url(process)
    except BaseException:
        process.stop()  # never left running when the console cannot start
        raise


def start_console(endpoint: str, log_dir: Path, *args: str) -> tuple[PopmqProcess, str]:
    process = PopmqProcess(
        ["console", "--endpoint", endpoint, "--port", str(free_port()), *args],
        log_dir / "console.log",
    )
    try:
        return process, console_url(process)
    except BaseException:
        process.stop()
        raise


def admin_call(
    endpoint: str, method: str, request: Any, keys: tuple[str, str] | None = None
) -> Any:
    metadata = signed_metadata(*keys) if keys else None
    with grpc.insecure_channel(endpoint) as channel:
        response = getattr(admin_pb2_grpc.AdminServiceStub(channel), method)(
            request, timeout=10, metadata=metadata
        )
    assert response.status.code == 20000, response.status
    return response


def dead_letter(
    endpoint: str,
    topic: str,
    group: str,
    keys: tuple[str, str] | None = None,
    timeout: float = 60,
) -> str:
    """Send one message to `topic` and let `group` fail it once with max attempts 1, so it
    lands in %DLQ%group; returns its message id."""
    from popmq.broker.contract.types import Message

    from popmq.client import Client
    from popmq.client.security import ClientSecurity

    admin_call(endpoint, "UpdateGroup", a.UpdateGroupRequest(name=group, max_attempts=1), keys)
    security = ClientSecurity(*keys) if keys else None
    with Client(endpoint, security=security) as client:
        [receipt] = client.send([Message(topic, b"poison", keys=["dead-key"])])
        got = []
        deadline = time.monotonic() + timeout
        while not got and time.monotonic() < deadline:
            for queue in client.query_route(topic):
                got += client.receive(group, queue, invisible_ms=1000, long_polling_ms=0)
    assert got, "the message was never received"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = admin_call(endpoint, "ListDlq", a.ListDlqRequest(group=group), keys)
        if listed.total:
            return receipt.message_id
        time.sleep(0.2)
    raise AssertionError(f"nothing reached %DLQ%{group} within {timeout}s")


def api(base: str, auth: tuple[str, str] | None = None) -> httpx.Client:
    return httpx.Client(base_url=base, auth=auth, timeout=30)


def screenshot(page: Any, name: str, tmp: Path) -> Path:
    folder = (REPO / SCREENSHOTS) if SCREENSHOTS else tmp
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"console-{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path
