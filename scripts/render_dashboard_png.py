"""Render docs/img/dashboard.png: the main panels of popmq's Grafana dashboard, from a real run.

There is no Grafana here, so this does what it would: start a real `popmq serve` (2 embedded
brokers), drive a small load through popmq's own client for --seconds, scrape the server's
/metrics every --interval seconds, and plot the dashboard's main queries (rates over one scrape
interval, quantiles from the histogram buckets) with matplotlib: every panel of
scripts/gen_dashboard.py, each target's PromQL evaluated over the scrapes (``evaluate``).

The load: a producer sends to `orders` (0.2-5.6 KB, one in 8 a delay message) and `audit`
(its rate doubles halfway); group `billing`
acks everything, group `shipping` consumes `orders` slowly (its lag grows), group `auditor`
never acks one message in five, with max attempts 2, so those reach its DLQ; group `oncall`
long-polls a quiet topic `alerts` (5 s polls, a message every 8 s): the empty answers.

Usage (matplotlib is a docs tool, not a runtime dependency):
    .venv/bin/pip install -e '.[docs]'
    .venv/bin/python scripts/render_dashboard_png.py [--seconds 60] [--out docs/img/dashboard.png]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

from popmq.broker.contract.types import Message
from prometheus_client.parser import text_string_to_metric_families

from popmq.client import Client, QueueRef, ReceivedMessage

ROOT = Path(__file__).resolve().parent.parent
Labels = frozenset[tuple[str, str]]
Scrape = dict[tuple[str, Labels], float]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def served(data_dir: Path) -> Iterator[tuple[str, int]]:
    port, metrics = free_port(), free_port()
    command = [sys.executable, "-m", "popmq", "serve", "--port", str(port),
               "--metrics-port", str(metrics), "--brokers", "2", "--data-dir", str(data_dir),
               "--log-level", "warning", "--console-port", "0",
               "--set", "broker.pop.min_invisible_ms=500",
               "--set", "proxy.min_invisible_ms=500"]  # fmt: skip
    process = subprocess.Popen(command)
    endpoint = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=1).read()
                subprocess.run([sys.executable, "-m", "popmq", "health", "--endpoint", endpoint],
                               check=True, capture_output=True)  # fmt: skip
                break
            except (OSError, subprocess.CalledProcessError):
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("popmq serve did not start") from None
                time.sleep(0.3)
        yield endpoint, metrics
    finally:
        process.terminate()
        process.wait(timeout=20)


def admin(endpoint: str, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "popmq", "admin", "--endpoint", endpoint, *args],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip


# -- load ----------------------------------------------------------------------------------------


def producer(endpoint: str, stop: threading.Event, started: float, seconds: float) -> None:
    with Client(endpoint) as client:
        n, last_alert = 0, 0.0
        while not stop.is_set():
            fast = time.monotonic() - started > seconds / 2
            # Orders of a few hundred bytes to a few KiB; every 8th a delay message (2 s).
            batch = [Message("orders", f"order-{n + i}".encode().ljust(200 + (n + i) % 7 * 900),
                             delivery_timestamp_ms=int(time.time() * 1000) + 2_000
                             if (n + i) % 8 == 0 else 0)
                     for i in range(4 if fast else 2)]  # fmt: skip
            client.send([*batch, Message("audit", f"audit-{n}".encode())])
            if time.monotonic() - last_alert > 8:  # a quiet topic: most long polls end empty
                client.send([Message("alerts", f"alert-{n}".encode())])
                last_alert = time.monotonic()
            n += len(batch)
            time.sleep(0.1)


def consumer(
    endpoint: str, group: str, topic: str, stop: threading.Event,
    ack: Callable[[ReceivedMessage], bool], pause_s: float = 0.0, invisible_ms: int = 10_000,
) -> None:  # fmt: skip
    with Client(endpoint) as client:
        queues: list[QueueRef] = client.query_route(topic)
        while not stop.is_set():
            for queue in queues:
                if stop.is_set():
                    return
                got = client.receive(group, queue, batch_size=8, invisible_ms=invisible_ms,
                                     long_polling_ms=5_000)  # fmt: skip
                keep = [(m.message_id, m.receipt_handle) for m in got if ack(m)]
                if keep:
                    client.ack(group, topic, keep)
                time.sleep(pause_s)


# -- scraping and queries --------------------------------------------------------------------------


def scrape(metrics_port: int) -> Scrape:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
    out: Scrape = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


# -- the dashboard's PromQL, evaluated over the scrapes ------------------------------------------
#
# The dashboard (scripts/gen_dashboard.py) uses a handful of PromQL shapes; these are evaluated
# here as Prometheus would over scrapes taken every --interval seconds (rate() over one
# interval, increase() as that rate times its window, histogram_quantile() with Prometheus'
# linear interpolation inside the bucket).

Series = dict[str, list[tuple[float, float]]]
_AGG = re.compile(r"^(sum|max|min)(?: by \(([^)]*)\))? ?\((.*)\)$", re.S)
_RANGE = re.compile(r"^(rate|increase)\((\w+)(\{[^}]*\})?\[(\d+)([smh])\]\)$")
_SELECTOR = re.compile(r"^(\w+)(\{[^}]*\})?$")
_QUANTILE = re.compile(r"^histogram_quantile\(([\d.]+), (.*)\)$", re.S)
_MATCHER = re.compile(r'(\w+)\s*(=~|!=|=)\s*"([^"]*)"')
_UNITS = {"s": 1, "m": 60, "h": 3600}
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def _matchers(text: str | None) -> list[tuple[str, str, str]]:
    return _MATCHER.findall((text or "").replace("$namespace", ".*"))


def _selected(labels: Labels, matchers: list[tuple[str, str, str]]) -> bool:
    found = dict(labels)
    for key, op, want in matchers:
        value = found.get(key, "")
        if (op == "=" and value != want) or (op == "!=" and value == want):
            return False
        if op == "=~" and not re.fullmatch(want, value):
            return False
    return True


# One evaluation step: (time, {label set: value}).
Vector = dict[Labels, float]


def _inner(expr: str, samples: list[tuple[float, Scrape]]) -> list[tuple[float, Vector]]:
    if found := _RANGE.match(expr):
        fn, name, selector, amount, unit = found.groups()
        window = int(amount) * _UNITS[unit]
        matchers, steps = _matchers(selector), []
        for (t0, a), (t1, b) in itertools.pairwise(samples):
            vector: Vector = {}
            for (sample, labels), value in b.items():
                if sample == name and _selected(labels, matchers):
                    rate = max(value - a.get((sample, labels), 0.0), 0.0) / (t1 - t0)
                    vector[labels] = rate * window if fn == "increase" else rate
            steps.append((t1, vector))
        return steps
    if found := _SELECTOR.match(expr):
        name, selector = found.groups()
        matchers = _matchers(selector)
        return [(t, {labels: v for (sample, labels), v in scraped.items()
                     if sample == name and _selected(labels, matchers)})
                for t, scraped in samples]  # fmt: skip
    raise ValueError(f"PromQL shape not evaluated here: {expr}")


def _aggregate(expr: str, samples: list[tuple[float, Scrape]]) -> list[tuple[float, Vector]]:
    found = _AGG.match(expr)
    if found is None:
        return _inner(expr, samples)
    op, keys, inner = found.groups()
    names = [k.strip() for k in (keys or "").split(",") if k.strip()]
    fold = {"sum": sum, "max": max, "min": min}[op]
    steps = []
    for t, vector in _inner(inner, samples):
        groups: dict[Labels, list[float]] = defaultdict(list)
        for labels, value in vector.items():
            found_labels = dict(labels)
            groups[frozenset((k, found_labels.get(k, "")) for k in names)].append(value)
        steps.append((t, {key: fold(values) for key, values in groups.items()}))
    return steps


def _quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative bucket counts {le: count}."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound  # the highest finite bound, as Prometheus answers
            width = count - lower_count
            share = (rank - lower_count) / width if width else 0.0
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return None


def evaluate(expr: str, legend: str, samples: list[tuple[float, Scrape]]) -> Series:
    """One dashboard target over the scrapes: {legend: [(time, value)]}."""
    quantile = _QUANTILE.match(expr)
    steps = _aggregate(quantile.group(2) if quantile else expr, samples)
    series: Series = defaultdict(list)
    for t, vector in steps:
        if quantile:
            by_group: dict[Labels, dict[float, float]] = defaultdict(dict)
            for labels, value in vector.items():
                found = dict(labels)
                le = float(found.pop("le"))
                by_group[frozenset(found.items())][le] = value
            points = {k: _quantile(float(quantile.group(1)), v) for k, v in by_group.items()}
            vector = {k: v for k, v in points.items() if v is not None}
        for labels, value in vector.items():
            name = _LEGEND.sub(lambda m, found=dict(labels): found.get(m.group(1), ""), legend)
            series[name.strip() or "all"].append((t, value))
    return series


# -- plotting --------------------------------------------------------------------------------------


def plot(samples: list[tuple[float, Scrape]], out: Path) -> None:
    """Every panel of the dashboard, each target evaluated as Grafana would ask Prometheus."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from gen_dashboard import PANELS  # the dashboard's own list (scripts/ is on sys.path)

    start = samples[0][0]
    columns = 4
    rows = -(-len(PANELS) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(22, 4.2 * rows), constrained_layout=True)
    for axis in axes.flat[len(PANELS) :]:
        axis.set_visible(False)
    for axis, (title, unit, targets) in zip(axes.flat, PANELS, strict=False):
        axis.set_title(f"{title} ({unit})", fontsize=10)
        for expr, legend in targets:
            for name, points in sorted(evaluate(expr, legend, samples).items()):
                if points:  # flat zero lines too, as Grafana draws them
                    axis.plot([t - start for t, _ in points], [v for _, v in points],
                              label=name, linewidth=1.4)  # fmt: skip
        axis.set_xlabel("seconds")
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7, loc="upper left")
    figure.suptitle("popmq's Grafana dashboard, every panel: a real `popmq serve` (2 brokers) "
                    "under a small load, scraped every few seconds", fontsize=13)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=70)


def _audit_ack(message: ReceivedMessage) -> bool:
    """auditor never acks one audit message in five: after 2 attempts they go to its DLQ."""
    return not message.body.endswith(b"0")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="load duration (default 60)")
    parser.add_argument("--interval", type=float, default=3.0, help="scrape interval (default 3)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "dashboard.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data, served(Path(data)) as (endpoint, metrics):
        admin(endpoint, "topics", "create", "orders", "--queues", "2", "--message-type", "MIXED")
        admin(endpoint, "topics", "create", "audit", "--queues", "1")
        admin(endpoint, "topics", "create", "alerts", "--queues", "1")
        admin(endpoint, "groups", "set", "auditor", "--max-attempts", "2", "--retry-levels", "1s")
        stop = threading.Event()
        started = time.monotonic()
        threads = [
            threading.Thread(target=producer, args=(endpoint, stop, started, args.seconds)),
            threading.Thread(target=consumer, args=(endpoint, "billing", "orders", stop,
                                                    lambda m: True)),
            threading.Thread(target=consumer, args=(endpoint, "shipping", "orders", stop,
                                                    lambda m: True, 0.5)),
            threading.Thread(target=consumer, args=(endpoint, "auditor", "audit", stop,
                                                    _audit_ack, 0.0, 1_000)),
            threading.Thread(target=consumer, args=(endpoint, "oncall", "alerts", stop,
                                                    lambda m: True)),
        ]  # fmt: skip
        for thread in threads:
            thread.start()
        samples: list[tuple[float, Scrape]] = []
        try:
            while time.monotonic() - started < args.seconds:
                samples.append((time.monotonic(), scrape(metrics)))
                time.sleep(args.interval)
            samples.append((time.monotonic(), scrape(metrics)))
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=15)
    plot(samples, args.out)
    print(f"wrote {args.out} ({len(samples)} scrapes over {args.seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
