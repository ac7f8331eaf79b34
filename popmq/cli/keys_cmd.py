"""`popmq handle-keys`: a broker's receipt-handle keyring (list, rotate, retire).

    popmq handle-keys list --data-dir data/broker-a
    popmq handle-keys rotate --data-dir data/broker-a     # new active key; old ones still open
    popmq handle-keys retire 3f9c2a1b --data-dir data/broker-a

A running broker picks up the change within a second. Secrets are never printed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    keys = subparsers.add_parser(
        "handle-keys", help="list, rotate or retire a broker's receipt-handle keys",
        description="Manage the keyring that seals a broker's receipt handles.",
    )  # fmt: skip
    _keyring_options(keys)
    commands = keys.add_subparsers(dest="keys_command", required=True)
    listing = commands.add_parser("list", help="key ids, which is active, when made")
    rotate = commands.add_parser("rotate", help="add a new active key")
    retire = commands.add_parser("retire", help="remove an old key (its handles stop working)")
    retire.add_argument("key_id")
    # `handle-keys rotate --data-dir DIR` (as the docs write it) and `handle-keys --data-dir
    # DIR rotate` both work; after the verb the flags default to SUPPRESS so they do not
    # reset one given before it.
    for verb, func in ((listing, _list), (rotate, _rotate), (retire, _retire)):
        _keyring_options(verb, suppress=True)
        verb.set_defaults(func=func, keys_parser=verb)


def _keyring_options(parser: argparse.ArgumentParser, suppress: bool = False) -> None:
    default = argparse.SUPPRESS if suppress else None
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--data-dir", default=default,
                       help="the broker's data directory (its handle-keys.json)")  # fmt: skip
    where.add_argument("--file", default=default,
                       help="a keyring file given with --handle-keys-file")  # fmt: skip


def _path(args: argparse.Namespace) -> Path:
    from popmq.broker.pop.handle_keys import DEFAULT_NAME

    if args.data_dir and args.file:
        args.keys_parser.error("argument --file: not allowed with argument --data-dir")
    if args.file:
        return Path(args.file)
    if args.data_dir:
        return Path(args.data_dir) / DEFAULT_NAME
    return args.keys_parser.error("one of the arguments --data-dir --file is required")


def _guarded(work: Callable[[], object]) -> int:
    from popmq.broker.pop.handle_keys import KeyringError

    try:
        work()
    except KeyringError as exc:
        print(f"popmq handle-keys: {exc}", file=sys.stderr)
        return 1
    return 0


def _list(args: argparse.Namespace) -> int:
    from popmq.broker.pop.handle_keys import read_keys

    def work() -> None:
        active, keys = read_keys(_path(args))
        for key in keys:
            print(f"{key.key_id}  {key.created}  {'active' if key.key_id == active else ''}")

    return _guarded(work)


def _rotate(args: argparse.Namespace) -> int:
    from popmq.broker.pop.handle_keys import rotate

    return _guarded(lambda: print(f"new active key {rotate(_path(args)).key_id}"))


def _retire(args: argparse.Namespace) -> int:
    from popmq.broker.pop.handle_keys import retire

    def work() -> None:
        retire(_path(args), args.key_id)
        print(f"retired {args.key_id}")

    return _guarded(work)
