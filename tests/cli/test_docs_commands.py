"""The `popmq` commands README.md and docs/*.md show are the commands popmq has.

- Every shell code block line is a `popmq` command (or in OFFLINE_ALLOWLIST with its reason);
  every `popmq` line of a code block parses as written (placeholders such as DIR filled in).
- Every inline `popmq ...` mention (and its ` / `-separated continuations in tables) names
  subcommands and flags that exist where it puts them.
- The admin commands among them run against a real `popmq serve` (exit 0, or 1 for a refusal
  such as an unknown group; never a usage error or a traceback), and the handle-keys commands
  against a real keyring.
"""

from __future__ import annotations

import argparse
import functools
import re
import shlex
from pathlib import Path

import pytest
from cli_support import popmq
from support.official_clients import REPO, Deployment

from popmq.cli import build_parser
from popmq.config import BrokerConfig

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "deploy/k8s/README.md"]

# Shell lines that cannot run offline or would not return (the one short list to keep).
OFFLINE_ALLOWLIST = {
    "make run": "starts the server and runs until stopped",
    "make test": "the whole suite (and installs)",
    "python3 -m venv .venv-client && .venv-client/bin/pip install rocketmq-python-client==5.1.2":
        "downloads from PyPI",
    ".venv-client/bin/python quickstart.py": "tests/official/test_readme_quickstart.py runs it",
    "pip install 'popmq[spark]'": "downloads from PyPI",
    "spark-submit --master 'local[2]' deploy/spark/topic_report.py": "needs Spark and Java",
    "--endpoint 127.0.0.1:8081 --topic orders --out /tmp/orders-report": "(the line above)",
}  # fmt: skip
# Inline spans that quote popmq's output, not a command.
OUTPUT_LINES = ("popmq proxy listening on ", "popmq metrics on ")

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_SPAN_RUN = re.compile(r"`(popmq [^`]+)`((?:\s*/\s*`[^`]+`)*)")
_PLACEHOLDERS = {
    "NAME=HOST:PORT": "b=127.0.0.1:1", "HOST:PORT": "127.0.0.1:1", "HOST[:PORT]": "127.0.0.1",
    "GROUP": "docs-group", "TOPIC": "docs-topic", "KEY": "k-1", "ID": "0A0B0C0D",
    "DIR": "{dir}", "FILE": "{file}", "NAME": "broker-x", "NS": "ns-a", "N": "2", "URL": "u",
}  # fmt: skip


def _shell_blocks() -> list[tuple[Path, str]]:
    """(file, line) of every line in a sh/bash block, and `popmq` lines of unlabelled ones."""
    found = []
    for path in DOCS:
        for fence in _FENCE.finditer(path.read_text()):
            for line in fence.group(2).splitlines():
                line = line.split("  #")[0].strip().rstrip("\\").strip()
                if line and (fence.group(1) in ("sh", "bash") or line.startswith("popmq ")):
                    found.append((path, line))
    return found


def _spans() -> list[tuple[Path, str]]:
    found = []
    for path in DOCS:
        for run in _SPAN_RUN.finditer(path.read_text()):
            first = run.group(1)
            if first.startswith(OUTPUT_LINES):
                continue
            found.append((path, first))
            family = " ".join(first.split()[:2])  # `popmq admin` + `topics list`
            for more in re.findall(r"`([^`]+)`", run.group(2)):
                if more.startswith("-"):  # `... --id ID` / `--all`: the same verb's flag
                    found.append((path, f"{first.split(' -')[0]} {more}"))
                else:
                    found.append((path, f"{family} {more}"))
    return found


def _fill(command: str, where: Path) -> list[str]:
    """argv (without `popmq`): optional [parts] kept, the first of a|b, placeholders filled."""
    command = re.sub(r"\[([^\]]*)\]", r"\1", command).replace("...", " ")
    words = []
    for word in shlex.split(command)[1:]:
        if "|" in word and not word.startswith("-"):
            word = word.split("|")[0]
        elif "|" in word:
            word = word.split("|")[0]
        for placeholder, value in _PLACEHOLDERS.items():
            if word == placeholder or word.endswith(f"={placeholder}"):
                word = word[: len(word) - len(placeholder)] + value
        words.append(word.format(dir=where / "data", file=where / "file"))
    return words


# The real parser, built once (a build takes about 0.2 s; hundreds of spans are checked):
# parsing leaves it unchanged.
_parser = functools.cache(build_parser)


def _innermost(argv: list[str]) -> argparse.ArgumentParser:
    parser = _parser()
    for word in argv:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) and word in action.choices:
                parser = action.choices[word]
    return parser


def _parses(argv: list[str]) -> bool:
    try:
        _parser().parse_args(argv)
    except SystemExit:
        return False
    return True


def test_every_shell_line_is_a_command_or_allowlisted(tmp_path: Path) -> None:
    lines = _shell_blocks()
    assert len(lines) > 10
    problems = []
    for path, line in lines:
        if line in OFFLINE_ALLOWLIST:
            continue
        if not line.startswith("popmq "):
            problems.append(f"{path.name}: not a popmq command, not allowlisted: {line}")
            continue
        for alternative in line.split(" | "):
            if not alternative.startswith("popmq "):
                alternative = f"popmq admin {alternative}"  # `topics list | topics delete x`
            if not _parses(_fill(alternative, tmp_path)):
                problems.append(f"{path.name}: does not parse: {alternative}")
    assert problems == []
    stale = set(OFFLINE_ALLOWLIST) - {line for _, line in lines}
    assert stale == set(), "allowlisted lines no doc shows any more"


def test_every_inline_mention_names_real_commands_and_flags(tmp_path: Path) -> None:
    spans = _spans()
    assert len(spans) > 40
    problems = []
    for path, span in spans:
        argv = _fill(span, tmp_path)
        parser = _innermost(argv)
        words = [w for w in argv if not w.startswith("-")]
        path_words = parser.prog.split()[1:]
        if words and words[0] not in path_words and parser.prog == "popmq":
            problems.append(f"{path.name}: no command {words[0]!r}: `{span}`")
        for word in argv:
            flag = word.split("=")[0]
            if flag.startswith("--") and flag not in parser._option_string_actions:
                problems.append(f"{path.name}: {parser.prog} has no {flag}: `{span}`")
    assert problems == []


def _runnable_admin_commands(tmp_path: Path) -> list[list[str]]:
    seen: list[list[str]] = []
    candidates = [line for _, line in _shell_blocks()] + [span for _, span in _spans()]
    for text in candidates:
        for alternative in text.split(" | "):
            if not alternative.startswith("popmq "):
                alternative = f"popmq admin {alternative}"
            argv = _fill(alternative, tmp_path)
            # Commands that read etcd (cluster status --etcd, brokers drain/remove) need a
            # running etcd; tests/coord/test_ha_processes.py runs them against a real one.
            if "--etcd" in argv or argv[1:2] == ["brokers"]:
                continue
            if argv[:1] == ["admin"] and _parses(argv) and argv not in seen:
                seen.append(argv)
    return seen


@pytest.mark.subprocess
def test_admin_commands_run(served: Deployment, tmp_path: Path) -> None:
    commands = _runnable_admin_commands(tmp_path)
    assert len(commands) > 20
    failures = []
    for argv in commands:
        argv = [w for w in argv if w != "127.0.0.1:8081"]
        argv = ["admin", "--endpoint", served.endpoint, *argv[1:]]
        if "--endpoint" in argv[3:]:  # the doc's own --endpoint: ours instead
            at = argv.index("--endpoint", 3)
            del argv[at : at + 1]
        result = popmq(*argv)
        if result.returncode not in (0, 1) or "Traceback" in result.stderr:
            failures.append((argv, result.returncode, result.stderr[-300:]))
    assert failures == []


@pytest.mark.subprocess
def test_handle_keys_commands_run(tmp_path: Path) -> None:
    from popmq.broker.pop.handle_keys import HandleKeyring

    HandleKeyring.open(BrokerConfig(name="b", data_dir=tmp_path / "data"))
    commands = [_fill(span, tmp_path) for _, span in _spans() if " handle-keys " in f" {span}"]
    # (`retire ID` / `list` after `rotate --data-dir DIR` in a table leave the flag implied)
    runnable = [argv for argv in commands if _parses(argv) and "--data-dir" in argv]
    assert ["handle-keys", "rotate", "--data-dir", str(tmp_path / "data")] in runnable
    for argv in runnable:
        result = popmq(*argv)
        assert result.returncode == 0, (argv, result.stderr)
