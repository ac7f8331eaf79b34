"""The help pages and usage errors a user reads: global flags explained once (not copied into
every subcommand's help), truthful help texts, --config where servers take it, and a
suggestion for a typo with exit code 2."""

from __future__ import annotations

import argparse

import pytest

from popmq.cli import build_parser, main
from popmq.cli.parser_kit import subparsers_of

GLOBAL_FLAGS = ("--log-level", "--log-format", "--otlp-endpoint")
ADMIN_FLAGS = ("--endpoint", "--access-key", "--tls-ca", "--namespace")


def _parsers() -> list[argparse.ArgumentParser]:
    parser = build_parser()
    return [parser, *subparsers_of(parser)]


def _options_section(parser: argparse.ArgumentParser) -> str:
    text = parser.format_help()
    return text.split("\noptions:", 1)[-1].split("\nAlso accepted here:", 1)[0]


def test_global_flags_are_explained_once() -> None:
    for parser in _parsers():
        options = _options_section(parser)
        for flag in GLOBAL_FLAGS:
            assert (f"  {flag} " in options) == (parser.prog == "popmq"), (parser.prog, flag)
        if parser.prog.startswith("popmq admin "):
            assert not any(f"  {flag} " in options for flag in ADMIN_FLAGS), parser.prog
            assert "--endpoint" in parser.format_help()  # named in the closing note
    topics_list = build_parser().parse_args(["admin", "topics", "list", "--json"])
    assert topics_list.json is True  # still accepted there


def test_servers_show_config() -> None:
    for parser in _parsers():
        if parser.prog in ("popmq serve", "popmq proxy", "popmq broker"):
            assert "  --config FILE " in _options_section(parser), parser.prog


def test_help_texts_do_not_lie() -> None:
    for parser in _parsers():
        for action in parser._actions:
            text = parser._get_formatter()._expand_help(action) if action.help else ""
            if action.help == argparse.SUPPRESS:
                continue
            assert "(default: True)" not in text and "(default: False)" not in text, (
                parser.prog, action.option_strings, text,
            )  # fmt: skip
            if action.nargs is None and action.option_strings:  # one value: nothing to compare
                assert "to compare" not in text, (parser.prog, action.option_strings, text)
            assert "['" not in text, (parser.prog, action.option_strings, text)
    by_prog = {p.prog: p for p in _parsers()}
    e2e = by_prog["popmq bench e2e"].format_help()
    assert "long-polling strategy (default: adaptive)" in " ".join(e2e.split())


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["srve"], "did you mean 'serve'?"),
        (["admin", "topcs", "list"], "did you mean 'topics'?"),
        (["admin", "set-consume-mode", "g", "pul"], "did you mean 'pull'?"),
        (["admin", "topics", "list", "--jsn"], "did you mean --json?"),
        (["serve", "--brokerz", "2"], "did you mean --brokers?"),
    ],
)
def test_typos_get_a_suggestion(
    argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert hint in err and "Traceback" not in err, err


def test_unrelated_words_get_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["xyzzy"])
    assert stopped.value.code == 2
    assert "did you mean" not in capsys.readouterr().err
