"""The `popmq` command: one entry point, one module per subcommand family.

Each module in COMMAND_MODULES exposes ``register(subparsers)``, which adds its subcommands
and sets ``func`` (a callable taking the parsed args and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMAND_MODULES = (
    "popmq.cli.broker_cmd",  # popmq broker
    "popmq.cli.proxy_cmd",  # popmq serve, popmq proxy
    "popmq.cli.admin_cmd",  # popmq admin ...
    "popmq.cli.bench_cmd",  # popmq bench ...
    "popmq.cli.keys_cmd",  # popmq handle-keys ...
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="popmq", description="RocketMQ 5 POP consumption behind a stateless gRPC proxy"
    )
    parser.add_argument("--config", help="YAML/JSON config file (see docs/operations.md)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override any config field, e.g. --set proxy.min_long_polling_ms=2000",
    )  # fmt: skip
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # that command family is not built yet
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
