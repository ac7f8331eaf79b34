"""Serving the console with uvicorn, as a task its caller owns (`popmq console`, or beside
the proxy in `popmq serve`): the caller's stop event ends it, the caller handles signals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator

import anyio
import uvicorn

from popmq.console.app import LOOPBACK_NAMES, build_app
from popmq.console.state import ConsoleState

log = logging.getLogger(__name__)
STARTUP_TIMEOUT_S = 30.0


class _OwnedServer(uvicorn.Server):
    """uvicorn without its own signal handlers: they would replace the process's."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _open_note(host: str) -> str:
    if host in LOOPBACK_NAMES:
        return "open to anyone on this machine"
    return f"open to anyone who can reach {host}"


async def serve_console(
    state: ConsoleState,
    host: str,
    port: int,
    announce: Callable[[str], None],
    stop: asyncio.Event,
) -> None:
    """Serve until `stop` is set. Announces `popmq console on http://HOST:PORT/`."""
    app = build_app(state, loopback=host in LOOPBACK_NAMES)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="on", access_log=False,
        server_header=False,
        # The peer's own address, never uvicorn's reading of X-Forwarded-For: it trusts the
        # header from 127.0.0.1 by default, and anyone on this host could then name a new
        # address per failed /login. console.trusted_proxies is applied by client_address.py.
        proxy_headers=False,
    )  # fmt: skip
    server = _OwnedServer(config)
    failed = anyio.Event()

    async def run() -> None:
        try:
            await server.serve()
        except SystemExit:  # uvicorn exits when it cannot bind (it logged why)
            failed.set()

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        with anyio.fail_after(STARTUP_TIMEOUT_S):
            # uvicorn says it listens by a flag only (no event to wait on)
            while not server.started and not failed.is_set():  # noqa: ASYNC110
                await anyio.sleep(0.05)
        if not failed.is_set():
            await _serving(server, host, state, announce, stop)
    if failed.is_set():  # raised here, outside the group: one plain error for the CLI
        raise OSError(f"the console could not listen on {host}:{port}")


async def _serving(
    server: uvicorn.Server,
    host: str,
    state: ConsoleState,
    announce: Callable[[str], None],
    stop: asyncio.Event,
) -> None:
    bound = server.servers[0].sockets[0].getsockname()[1]
    announce(f"popmq console on http://{host}:{bound}/")
    if await _acl_is_off(state):
        announce(f"popmq console: the proxy has no ACL, so the console is {_open_note(host)}")
    await stop.wait()
    server.should_exit = True


async def _acl_is_off(state: ConsoleState) -> bool:
    from popmq.console.admin_client import ConsoleError
    from popmq.console.identity import who_is

    try:
        return not (await who_is(state.client, None)).acl
    except ConsoleError:
        return False  # an ACL (401), or the proxy is not up yet: nothing to warn about
