"""`popmq console`: the web console, in its own process, over a proxy's admin API.

    popmq console --endpoint 127.0.0.1:8081 [--host 127.0.0.1] [--port 8080]
        [--access-key KEY --secret-key SECRET] [--tls | --tls-ca FILE]
        [--trusted-proxy ADDRESS[/BITS] ...] [--config FILE] [--set KEY=VALUE ...]

With an ACL on the proxy, users sign in with their own keys; the console's own keys (an admin's,
optional) let non-admin users read what their grants reach. Runs until SIGTERM or SIGINT.
`popmq serve` starts the same console beside its proxy (serve_with_console).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import anyio

from popmq.cli.common import config_from_args
from popmq.cli.failures import UserError

log = logging.getLogger(__name__)
DEFAULT_PORT = 8080
MISSING = "the console needs popmq's console extra: pip install 'popmq[console]'"


def register(subparsers: argparse._SubParsersAction) -> None:
    console = subparsers.add_parser(
        "console", help="serve the web console for a proxy's admin API",
        description="Serve the popmq web console (pages and a JSON API under /api/v1/), "
        "talking to a proxy's admin API.",
    )  # fmt: skip
    console.add_argument("--endpoint", default="127.0.0.1:8081", help="the proxy's admin address")
    console.add_argument(
        "--host", default="127.0.0.1",
        help="address to listen on (without an ACL on the proxy the console is open: keep it "
        "on 127.0.0.1)",
    )  # fmt: skip
    console.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (0: any free one)")
    console.add_argument(
        "--access-key", default=os.environ.get("POPMQ_ACCESS_KEY"),
        help="the console's own admin key, to read for non-admin users (env POPMQ_ACCESS_KEY)",
    )  # fmt: skip
    console.add_argument(
        "--secret-key", default=os.environ.get("POPMQ_SECRET_KEY"),
        help="its secret key (env POPMQ_SECRET_KEY; prefer the env to the command line)",
    )  # fmt: skip
    console.add_argument(
        "--tls-ca", metavar="FILE", help="connect with TLS, trusting this CA (PEM)"
    )
    console.add_argument(
        "--tls", action="store_true", help="connect with TLS, trusting the system's CAs"
    )
    console.add_argument(
        "--trusted-proxy", action="append", metavar="ADDRESS[/BITS]",
        help="a reverse proxy whose X-Forwarded-For names the client (repeatable; "
        "console.trusted_proxies; default none: the TCP peer is the client)",
    )  # fmt: skip
    console.add_argument(
        "--config", default=argparse.SUPPRESS, metavar="FILE",
        help="YAML/JSON config file (its console section); flags and --set override it",
    )  # fmt: skip
    console.add_argument(
        "--set", action="append", default=argparse.SUPPRESS, metavar="KEY=VALUE",
        help="override a config field, e.g. --set console.trusted_proxies=10.0.0.5",
    )  # fmt: skip
    console.set_defaults(func=run)


def _announce(line: str) -> None:
    print(line, flush=True)


def run(args: argparse.Namespace) -> int:
    if bool(args.access_key) != bool(args.secret_key):
        raise UserError("give both --access-key and --secret-key (or POPMQ_* env), or neither")
    try:
        from popmq.console.admin_client import AdminTarget, Credentials
        from popmq.console.state import ConsoleState
    except ModuleNotFoundError as exc:
        raise UserError(f"{MISSING} ({exc.name} is missing)") from None
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    reader = Credentials(args.access_key, args.secret_key) if args.access_key else None
    config = config_from_args(args, {"console.trusted_proxies": args.trusted_proxy})

    async def main() -> None:
        from popmq.console.client_address import trusted_networks
        from popmq.console.server import serve_console

        # made in the loop: its gRPC channel belongs to it
        state = ConsoleState(
            AdminTarget(args.endpoint, args.tls, args.tls_ca), reader,
            trusted_proxies=trusted_networks(config.console.trusted_proxies),
        )  # fmt: skip
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve_console(state, args.host, args.port, _announce, stop)

    try:
        asyncio.run(main())
    except OSError as exc:
        print(f"popmq console: {exc}", flush=True)
        return 2
    return 0


# -- beside `popmq serve` ----------------------------------------------------------------------

PROXY_LINE = "popmq proxy listening on "
ADMIN_LINE = "popmq admin listening on "


async def serve_with_console(
    serve: Callable[[Callable[[str], None], asyncio.Event], Coroutine[Any, Any, None]],
    console_port: int,
    tls: bool,
    announce: Callable[[str], None],
    trusted_proxies: Sequence[str] = (),
) -> None:
    """Run `serve(announce, stop)` (the proxy) and, once it listens, the console on
    127.0.0.1:console_port against its admin API. A console that cannot start (port taken,
    extra not installed) is reported and the proxy goes on."""
    stop = asyncio.Event()
    endpoints: dict[str, str] = {}
    listening = asyncio.Event()

    def tap(line: str) -> None:
        announce(line)
        for prefix in (PROXY_LINE, ADMIN_LINE):
            if line.startswith(prefix):
                host, _, port = line[len(prefix) :].rpartition(":")
                endpoints[prefix] = f"{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
                listening.set()

    async def console() -> None:
        await listening.wait()
        await asyncio.sleep(0)  # the admin line follows the proxy line in the same step
        if stop.is_set():
            return
        if tls:
            announce("popmq console: not started (the proxy has TLS): run `popmq console "
                     "--tls-ca FILE` against it")  # fmt: skip
            return
        try:
            from popmq.console.admin_client import AdminTarget
            from popmq.console.client_address import trusted_networks
            from popmq.console.server import serve_console
            from popmq.console.state import ConsoleState
        except ModuleNotFoundError:
            announce(f"popmq console: not started ({MISSING})")
            return
        endpoint = endpoints.get(ADMIN_LINE) or endpoints[PROXY_LINE]
        state = ConsoleState(
            AdminTarget(endpoint), trusted_proxies=trusted_networks(trusted_proxies)
        )
        try:
            await serve_console(state, "127.0.0.1", console_port, announce, stop)
        except OSError as exc:
            log.warning("console not started: %s (choose another with --console-port)", exc)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(console)
            try:
                await serve(tap, stop)
            finally:
                stop.set()
                listening.set()  # a proxy that failed to start: no console either
    except BaseExceptionGroup as failed:
        # The proxy's own error (a taken port, a bad ACL file) reaches the CLI as it is, to be
        # told in one line, as without the console.
        if len(failed.exceptions) == 1:
            raise failed.exceptions[0] from None
        raise
