"""`popmq proxy --workers N`: N proxy processes sharing one port through SO_REUSEPORT.

The proxy keeps no state of its own, so N workers behind one port are N proxies: the kernel
spreads new connections over them (a client connection stays on one worker). Each worker
is ``popmq proxy`` itself with the same flags, ``--workers 1`` and ``proxy.reuse_port``; a
Prometheus port P becomes P, P+1, ... one per worker. This process only supervises: it prints
the one ``popmq proxy listening on HOST:PORT`` line once every worker listens, forwards
SIGTERM/SIGINT, and stops them all (exit 1) when one dies on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Callable, Sequence

import anyio

from popmq.config import PopmqConfig

log = logging.getLogger("popmq.proxy.workers")

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


def _reserve_port(host: str, port: int) -> socket.socket:
    """Bind (not listen) a SO_REUSEPORT socket, so port 0 becomes one port every worker
    shares, and a port taken by something else fails here, before any worker starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def worker_argv(argv: Sequence[str], index: int, port: int, metrics_port: int | None) -> list[str]:
    # --set wins over every other source: a worker must never start workers of its own.
    settings = ["proxy.workers=1", f"proxy.port={port}", "proxy.reuse_port=true"]
    if metrics_port:
        settings.append(f"proxy.metrics_port={metrics_port + index}")
    args = [sys.executable, "-m", "popmq", *argv]
    for setting in settings:
        args += ["--set", setting]
    return args


async def run_workers(
    config: PopmqConfig, argv: Sequence[str], announce: Callable[[str], None]
) -> int:
    proxy = config.proxy
    reserved = _reserve_port(proxy.host, proxy.port)
    port = reserved.getsockname()[1]
    workers: list[asyncio.subprocess.Process] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        for index in range(proxy.workers):
            workers.append(await asyncio.create_subprocess_exec(
                *worker_argv(argv, index, port, proxy.metrics_port),
                stdout=asyncio.subprocess.PIPE,
            ))  # fmt: skip
        async with asyncio.timeout(START_TIMEOUT_S):
            for worker in workers:
                await _until_listening(worker)
        reserved.close()
        announce(f"popmq proxy listening on {proxy.host}:{port}")
        log.info("%d proxy workers on %s:%d", len(workers), proxy.host, port)
        exited = asyncio.Event()  # a worker ended on its own

        async def watch_exit(worker: asyncio.subprocess.Process) -> None:
            await worker.wait()
            exited.set()
            stop.set()

        async with anyio.create_task_group() as group:
            for worker in workers:
                group.start_soon(_drain, worker)
                group.start_soon(watch_exit, worker)
            await stop.wait()
            failed = exited.is_set()
            if failed:
                log.error("a proxy worker exited on its own: stopping the others")
            codes = await _stop(workers)  # the drains keep reading until the workers end
            group.cancel_scope.cancel()
        return 1 if failed or any(codes) else 0
    finally:
        reserved.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await _stop(workers)


async def _until_listening(worker: asyncio.subprocess.Process) -> None:
    assert worker.stdout is not None
    while True:
        line = (await worker.stdout.readline()).decode()
        if not line:
            raise SystemExit("a proxy worker exited before listening")
        if "popmq proxy listening on" in line:
            return


async def _drain(worker: asyncio.subprocess.Process) -> None:
    """Keep reading a worker's stdout so it never blocks on a full pipe."""
    assert worker.stdout is not None
    while await worker.stdout.readline():
        pass


async def _stop(workers: list[asyncio.subprocess.Process]) -> list[int]:
    for worker in workers:
        if worker.returncode is None:
            worker.terminate()
    codes = []
    for worker in workers:
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                codes.append(await worker.wait())
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                worker.kill()
            codes.append(await worker.wait())
    return codes
