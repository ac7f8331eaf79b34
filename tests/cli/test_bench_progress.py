"""`popmq bench`'s live progress: per-phase n/total with a rate and time left, log lines printed
above the bar (never through it), and a live rate that is the final table's figure."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console

from popmq.bench import progress as live
from popmq.bench.broker_throughput import bench_broker
from popmq.cli.bench_display import live_progress
from popmq.cli.logs import configure_logging

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _frames(raw: str) -> list[str]:
    """The screen lines as drawn, escape sequences removed (a redraw starts after \\r)."""
    return [_ANSI.sub("", part) for line in raw.split("\n") for part in line.split("\r")]


def test_terminal_bars_count_per_phase_and_keep_logs_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stderr", screen)  # the log handler's stream is the console's
    configure_logging("info")
    console = Console(file=screen, force_terminal=True, width=150)
    try:
        with live_progress("bench t", console=console):
            live.phase("first", total=100)
            live.count(100)
            logging.getLogger("popmq.test").warning("a log line while the bar is shown")
            live.phase("second", total=100)
            live.count(30)
            live.measured()
    finally:
        logging.getLogger().handlers.clear()
    frames = _frames(screen.getvalue())
    logged = [f for f in frames if "a log line while the bar is shown" in f]
    assert logged and all(f.split(" WARNING ")[-1] == "popmq.test a log line while the bar "
                          "is shown" for f in logged), logged  # fmt: skip
    assert not any("━" in f for f in logged)  # never drawn into a bar's line
    last_first = [f for f in frames if "bench t first" in f][-1]
    last_second = [f for f in frames if "bench t second" in f][-1]
    assert "100/100" in last_first
    assert "30/100" in last_second  # this phase's count, not 130 over both


def test_piped_lines_name_each_phase_with_n_of_total() -> None:
    out = io.StringIO()
    with live_progress("bench p", console=Console(file=out, force_terminal=False)):
        live.phase("send", total=50)
        live.count(50)
        live.phase("receive", total=50)
        live.count(20)
    lines = out.getvalue().splitlines()
    assert [re.sub(r"^\[bench p\]\s+[\d.]+ s  ", "", line).split(",")[0] for line in lines] == [
        "send: 50/50 messages", "receive: 20/50 messages",
    ]  # fmt: skip


def test_eta_from_the_shown_rate() -> None:
    bench = live.BenchProgress(total=1000, phase_messages=250)
    bench.phase_ended = bench.phase_started + 1.0  # 250 msg/s
    assert bench.rate() == pytest.approx(250.0)
    assert bench.eta_s() == pytest.approx(3.0)
    assert live.BenchProgress(total=None, phase_messages=5).eta_s() is None


def test_live_rate_is_the_tables_rate(tmp_path: Path) -> None:
    closing: dict[str, float] = {}
    bench = live.BenchProgress(name="bench broker")
    bench.on_phase = lambda p: closing.__setitem__(p.phase, p.rate())
    live.attach(bench)
    try:
        result = asyncio.run(bench_broker(messages=2000, producers=2, consumers=2, queues=2,
                                          flush_modes=("async",), data_dir=tmp_path))  # fmt: skip
        closing[bench.phase] = bench.rate()
    finally:
        live.attach(None)
    figures = result["results"]["inproc/async"]
    for phase, key in (("send", "send_msgs_per_s"), ("pop+ack", "pop_ack_msgs_per_s"),
                       ("pull", "pull_msgs_per_s")):  # fmt: skip
        shown = closing[f"inproc/async: {phase}"]
        assert shown == pytest.approx(figures[key], rel=0.02), (phase, shown, figures)
