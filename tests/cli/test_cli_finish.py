"""The finished CLI: --version, help and defaults on every flag, global flags after the
subcommand, one-line user errors with exit 2, SIGPIPE, --log-format json."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import popmq
from support.official_clients import REPO, Deployment

from popmq.cli import build_parser
from popmq.cli.parser_kit import subparsers_of

pytestmark = pytest.mark.subprocess  # starts popmq or another process


def _one_line_error(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert needle in lines[0], lines[0]


def test_version() -> None:
    result = popmq("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("popmq ") and result.stdout.split()[1][0].isdigit()


def test_every_flag_and_argument_has_help() -> None:
    parser = build_parser()
    missing = [
        f"{each.prog} {action.option_strings or action.dest}"
        for each in (parser, *subparsers_of(parser))
        for action in each._actions
        if not action.help and not isinstance(action, argparse._SubParsersAction)
    ]
    assert missing == []


def test_bench_help_shows_defaults() -> None:
    result = popmq("bench", "idle", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "--long-polls LONG_POLLS concurrent idle receives (default: 2000)" in text
    assert "--duration DURATION seconds measured each (default: 20.0)" in text


def test_global_flags_after_the_subcommand() -> None:
    parser = build_parser()
    before = parser.parse_args(["admin", "--json", "--endpoint", "h:1", "topics", "list"])
    after = parser.parse_args(["admin", "topics", "list", "--json", "--endpoint", "h:1"])
    assert before.json is after.json is True
    assert before.endpoint == after.endpoint == "h:1"
    late = parser.parse_args(["serve", "--log-level", "debug", "--config", "c.yaml"])
    assert (late.log_level, late.config) == ("debug", "c.yaml")
    assert parser.parse_args(["--log-format", "json", "serve"]).log_format == "json"


def test_missing_config_file(tmp_path: Path) -> None:
    _one_line_error(popmq("--config", str(tmp_path / "nope.yaml"), "serve"), "no such file")


def test_bad_config_values() -> None:
    _one_line_error(popmq("serve", "--set", "proxy.port=abc"), "bad config: proxy.port")
    _one_line_error(popmq("serve", "--set", "proxy.nope=1"), "proxy.nope")
    env = {**os.environ, "POPMQ_PROXY__MIN_LONG_POLLING_MS": "soon"}
    _one_line_error(popmq("serve", env=env), "proxy.min_long_polling_ms")


def test_bad_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("proxy: [unclosed\n")
    _one_line_error(popmq("--config", str(path), "serve"), "bad config file")


def test_config_file_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- proxy\n- broker\n")
    _one_line_error(popmq("--config", str(path), "serve"), "must hold a mapping")


def test_taken_port(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = popmq(
            "serve", "--log-level", "error", "--brokers", "1", "--port", str(port),
            "--data-dir", str(tmp_path / "data"),
        )  # fmt: skip
    # grpc's C core may add its own log line; ours is the last and only traceback-free one
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr.strip().splitlines()[-1]


def test_data_dir_in_use(served: Deployment, tmp_path: Path) -> None:
    data_dir = served.processes[0].log_path.parent / "data"
    result = popmq(
        "serve", "--log-level", "error", "--brokers", "2", "--port", "0",
        "--data-dir", str(data_dir),
    )  # fmt: skip
    _one_line_error(result, "used by another store")


def test_unreachable_endpoint() -> None:
    _one_line_error(popmq("admin", "--endpoint", "127.0.0.1:1", "topics", "list"), "cannot reach")
    _one_line_error(popmq("health", "--endpoint", "127.0.0.1:1", "--timeout", "1"), "cannot reach")


@pytest.mark.parametrize("args", [["--help"], ["admin", "stats", "--raw"]])
def test_closed_stdout_is_quiet(served: Deployment, args: list[str]) -> None:
    """`popmq ... | head`: the reader is gone before popmq writes; no traceback."""
    if args[0] == "admin":
        args = ["admin", "--endpoint", served.endpoint, *args[1:]]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "popmq", *args], cwd=REPO, stdout=write_end,
            stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr
    # argparse's help printer swallows the error itself (exit 0); our own output ends as a
    # tool killed by SIGPIPE would
    assert result.returncode == (0 if args == ["--help"] else 141)


def test_json_logs_and_level(tmp_path: Path) -> None:
    result = popmq(
        "--log-format", "json", "serve", "--brokers", "1", "--port", "0",
        "--data-dir", str(tmp_path / "data"), "--set", "proxy.port=-1",
    )  # fmt: skip
    assert result.returncode == 2
    # the config is refused before anything logs; now one that logs, then stops on a bad port
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        result = popmq(
            "serve", "--log-format", "json", "--brokers", "1",
            "--port", str(holder.getsockname()[1]), "--data-dir", str(tmp_path / "data"),
        )  # fmt: skip
    records = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert any(r["level"] == "INFO" and "started" in r["msg"] for r in records), result.stderr
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records)
    quiet = popmq(
        "serve", "--log-level", "warning", "--brokers", "1", "--port", "-5",
        "--data-dir", str(tmp_path / "data"),
    )  # fmt: skip
    assert "INFO" not in quiet.stderr


def test_health(served: Deployment) -> None:
    result = popmq("health", "--endpoint", served.endpoint)
    assert result.returncode == 0 and result.stdout.strip().endswith("SERVING")
    as_json = json.loads(popmq("health", "--endpoint", served.endpoint, "--json").stdout)
    assert as_json == {"endpoint": served.endpoint, "status": "SERVING"}
    unknown = popmq("health", "--endpoint", served.endpoint, "--service", "no.such.Service")
    assert unknown.returncode == 1 and "SERVICE_UNKNOWN" in unknown.stdout


def test_otlp_endpoint_flag_reaches_the_config_and_starts_tracing() -> None:
    from popmq.cli.common import config_from_args

    args = build_parser().parse_args(["serve", "--otlp-endpoint", "http://127.0.0.1:4317"])
    assert config_from_args(args, {}).tracing.otlp_endpoint == "http://127.0.0.1:4317"
    # In a fresh process (the tracer provider is process-global): the OTEL_* variable alone
    # switches the exporter on, with popmq's service name.
    code = (
        "from opentelemetry import trace\n"
        "from popmq.tracing import start_tracing\n"
        "stop = start_tracing('', 'popmq-proxy')\n"
        "print(type(trace.get_tracer_provider()).__name__,"
        " trace.get_tracer_provider().resource.attributes['service.name'])\n"
        "stop()\n"
        "print('ok')\n"
    )
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    env.pop("OTEL_SERVICE_NAME", None)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.stdout.split() == ["TracerProvider", "popmq-proxy", "ok"], result.stderr
    off = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run(
        [sys.executable, "-c", "from popmq.tracing import start_tracing; "
         "print(start_tracing('', 'popmq-proxy'))"],
        cwd=REPO, env=off, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.stdout.strip() == "None"
