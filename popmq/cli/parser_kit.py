"""Argparse finishing touches shared by every subcommand: defaults in the help, global
flags that are accepted after the subcommand too (`popmq admin topics list --json`) without
repeating them in every subcommand's help, and a suggestion for a mistyped name."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

# Flags whose value is on or off: their default says nothing a reader needs.
_SWITCHES = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to a flag's help when it has a real default not already named."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or isinstance(action, _SWITCHES)
            or default in (None, False, argparse.SUPPRESS)
            or default == []
            or action.option_strings == []
        ):
            return text
        if isinstance(default, list | tuple):  # `a b c`, as it is typed, not "['a', 'b']"
            shown = " ".join(str(item) for item in default).replace("%", "%%")
            return f"{text} (default: {shown})".lstrip()
        return f"{text} (default: %(default)s)".lstrip()


class SuggestingParser(argparse.ArgumentParser):
    """Says "did you mean ...?" for a mistyped command, choice or flag (argparse gained that
    only in Python 3.14). Usage errors still exit 2, through ArgumentParser.error."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            close = _closest(str(value), [str(c) for c in action.choices or ()])
            if close is None:
                raise
            raise argparse.ArgumentError(
                action, f"{exc.message}; did you mean {close!r}?"
            ) from None

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        argv = getattr(self, "_argv", None)
        if unknown and argv is not None:
            parser = _innermost(self, argv)
            flags = list(parser._option_string_actions)
            hints = [
                close
                for word in unknown.group(1).split()
                if word.startswith("--")
                and (close := _closest(word.split("=", 1)[0], flags)) is not None
            ]
            if hints:
                message += f" (did you mean {', '.join(hints)}?)"
            if parser is not self:  # its usage line, not the top-level one
                parser.print_usage(sys.stderr)
                parser.exit(2, f"{parser.prog}: error: {message}\n")
        super().error(message)


def _closest(word: str, candidates: Sequence[str]) -> str | None:
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


def _innermost(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The subcommand's parser that `argv` names (`admin topics list` -> its parser)."""
    for word in argv:
        children = [
            a.choices
            for a in parser._actions
            if isinstance(a, argparse._SubParsersAction) and word in a.choices
        ]
        if children:
            parser = children[0][word]
    return parser


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
    "--strategy/1": "long-polling strategy",
    "--busy-consumers": "consumers of the busy scenario",
    "--busy-rate": "messages per second sent in the busy scenario",
    "--master": "Spark master URL",
    "--kind": "consumer kinds: pop (any consumer, any queue) or queue-bound (pull)",
    "--kind/1": "consumer kind: pop (any consumer, any queue) or queue-bound (pull)",
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
                if action.nargs is None:  # one value: the singular wording, where there is one
                    key = f"{key}/1" if f"{key}/1" in SHARED_HELP else key
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
        copied = []
        for action in globals_:
            if any(opt in child._option_string_actions for opt in action.option_strings):
                continue
            copied.append(action.option_strings[-1])
            kwargs: dict[str, Any] = {
                "dest": action.dest,
                "default": argparse.SUPPRESS,
                "help": argparse.SUPPRESS,  # accepted here, explained once in the parent's help
            }
            if isinstance(action, argparse._StoreTrueAction):
                kwargs["action"] = "store_true"
            elif isinstance(action, argparse._AppendAction):
                kwargs.update(action="append", metavar=action.metavar)
            else:
                kwargs.update(metavar=action.metavar, choices=action.choices, type=action.type)
            child.add_argument(*action.option_strings, **kwargs)
        if copied:
            also: list[str] = child.__dict__.setdefault("_also_accepted", [])
            also.append(f"{', '.join(copied)} (see `{parent.prog} --help`)")
            child.epilog = f"Also accepted here: {'; '.join(reversed(also))}."
