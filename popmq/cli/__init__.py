"""The `popmq` command: one entry point, one module per subcommand family.

Each module in COMMAND_MODULES exposes ``register(subparsers)``, which adds its subcommands
and sets ``func`` (a callable taking the parsed args and returning an exit code). Flags of
the top-level parser are accepted after any subcommand too (parser_kit.finish).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from popmq.cli.failures import USER_ERROR_EXIT, user_message
from popmq.cli.logs import FORMATS, LEVELS, configure_logging
from popmq.cli.parser_kit import DefaultsHelpFormatter, SuggestingParser, finish
from popmq.event_loop import EVENT_LOOP_CHOICES

COMMAND_MODULES = (
    "popmq.cli.broker_cmd",  # popmq broker
    "popmq.cli.proxy_cmd",  # popmq serve, popmq proxy
    "popmq.cli.admin_cmd",  # popmq admin ...
    "popmq.cli.console_cmd",  # popmq console
    "popmq.cli.health_cmd",  # popmq health
    "popmq.cli.bench_cmd",  # popmq bench ...
    "popmq.cli.keys_cmd",  # popmq handle-keys ...
)


def popmq_version() -> str:
    try:
        return version("popmq")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = SuggestingParser(
        prog="popmq",
        description="RocketMQ 5 POP consumption behind a stateless gRPC proxy",
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"popmq {popmq_version()}")
    parser.add_argument("--config", help="YAML/JSON config file (see docs/operations.md)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override any config field, e.g. --set proxy.min_long_polling_ms=2000",
    )  # fmt: skip
    parser.add_argument("--log-level", choices=LEVELS, default="info", help="log threshold")
    parser.add_argument(
        "--log-format", choices=FORMATS, default="text", help="json: one JSON object per line"
    )
    parser.add_argument(
        "--otlp-endpoint", metavar="URL",
        help="export OpenTelemetry traces over OTLP/gRPC, e.g. http://otel-collector:4317 "
        "(needs popmq[otel]; OTEL_EXPORTER_OTLP_ENDPOINT works too)",
    )  # fmt: skip
    parser.add_argument(
        "--event-loop", choices=EVENT_LOOP_CHOICES,
        help="the servers' asyncio loop (server.event_loop; default auto: uvloop if installed)",
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
    finish(parser)
    return parser


def _quiet_broken_pipe() -> int:
    """stdout's reader went away (`popmq ... | head`): stop like a Unix tool would, without
    a traceback, and keep Python from failing again when it flushes stdout at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by it


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except BrokenPipeError:  # `popmq --help | head -1`
        return _quiet_broken_pipe()
    configure_logging(args.log_level, args.log_format)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        return 130
    except SystemExit as exc:
        if isinstance(exc.code, str):  # raise SystemExit("message"): a user's error
            print(f"popmq {args.command}: {exc.code}", file=sys.stderr)
            return USER_ERROR_EXIT
        raise
    except Exception as exc:
        message = user_message(exc)
        if message is None:
            raise
        print(f"popmq {args.command}: {message}", file=sys.stderr)
        return USER_ERROR_EXIT


if __name__ == "__main__":
    sys.exit(main())
