"""Argparse finishing touches shared by every subcommand: defaults in the help and global
flags that are accepted after the subcommand too (`popmq admin topics list --json`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to a flag's help when it has a real default not already named."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default in (None, False, argparse.SUPPRESS)
            or default == []
            or action.option_strings == []
        ):
            return text
        return f"{text} (default: %(default)s)".lstrip()


# Help for flags and arguments that mean the same in every command that has them, so each
# parser definition stays a one-liner (a flag's own help= wins).
SHARED_HELP = {
    "--messages": "messages to send",
    "--body-bytes": "message body size in bytes",
    "--batch": "messages per send / pop / pull batch",
    "--producers": "concurrent producers",
    "--consumers": "concurrent consumers",
    "--queues": "queues per broker",
    "--brokers": "brokers to run",
    "--transport": "broker transports to compare (inproc: in-process calls)",
    "--flush": "store flush modes to compare",
    "--strategy": "long-polling strategies to compare",
    "--busy-consumers": "consumers of the busy scenario",
    "--busy-rate": "messages per second sent in the busy scenario",
    "--master": "Spark master URL",
    "--kind": "consumer kinds: pop (any consumer, any queue) or queue-bound (pull)",
    "--scenario": "scale: msg/s per consumer count; hang: one consumer stops acking",
    "--hang-consumers": "consumers of the hung-consumer run",
    "--hang-messages": "messages of the hung-consumer run",
    "--consume-mode": "POP: any consumer, any queue; PULL: queues bound to consumers",
    "--fifo": "deliver each message group in order",
    "--no-fifo": "no per-message-group order",
    "name": "topic or group name",
    "mode": "consume mode",
    "key_id": "receipt-handle key id (see `handle-keys list`)",
}


def subparsers_of(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every parser below `parser` (each once, depth first)."""
    seen: set[int] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                if id(child) not in seen:
                    seen.add(id(child))
                    yield child
                    yield from subparsers_of(child)


def finish(parser: argparse.ArgumentParser) -> None:
    """Defaults shown in every parser's help, and `parser`'s own flags (but -h/--version)
    accepted again after each subcommand; there they default to SUPPRESS, so a flag given
    before the subcommand is not reset by its absence after it."""
    parser.formatter_class = DefaultsHelpFormatter
    inherit(parser)
    for each in (parser, *subparsers_of(parser)):
        for action in each._actions:
            if action.help is None and not isinstance(action, argparse._SubParsersAction):
                key = action.option_strings[0] if action.option_strings else action.dest
                action.help = SHARED_HELP.get(key)


def inherit(parent: argparse.ArgumentParser) -> None:
    globals_ = [
        a
        for a in parent._actions
        if a.option_strings
        and not isinstance(a, argparse._HelpAction | argparse._VersionAction)
        and not isinstance(a, argparse._SubParsersAction)
    ]
    for child in subparsers_of(parent):
        child.formatter_class = DefaultsHelpFormatter
        for action in globals_:
            if any(opt in child._option_string_actions for opt in action.option_strings):
                continue
            kwargs: dict[str, Any] = {
                "dest": action.dest,
                "default": argparse.SUPPRESS,
                "help": action.help,
            }
            if isinstance(action, argparse._StoreTrueAction):
                kwargs["action"] = "store_true"
            elif isinstance(action, argparse._AppendAction):
                kwargs.update(action="append", metavar=action.metavar)
            else:
                kwargs.update(metavar=action.metavar, choices=action.choices, type=action.type)
            child.add_argument(*action.option_strings, **kwargs)
