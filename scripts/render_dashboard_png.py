"""Render docs/img/dashboard.png: the main panels of popmq's Grafana dashboard, from a real run.

There is no Grafana here, so this does what it would: start a real `popmq serve` (2 embedded
brokers), drive a small load through popmq's own client for --seconds, scrape the server's
/metrics every --interval seconds, and plot the dashboard's main queries (rates over one scrape
interval, p99 from the histogram buckets) with matplotlib.

The load: a producer sends to `orders` and `audit` (its rate doubles halfway); group `billing`
acks everything, group `shipping` consumes `orders` slowly (its lag grows), group `auditor`
never acks one message in five, with max attempts 2, so those reach its DLQ.

Usage (matplotlib is a docs tool, not a runtime dependency):
    .venv/bin/pip install -e '.[docs]'
    .venv/bin/python scripts/render_dashboard_png.py [--seconds 60] [--out docs/img/dashboard.png]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
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
               "--log-level", "warning",
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
        n = 0
        while not stop.is_set():
            fast = time.monotonic() - started > seconds / 2
            batch = [Message("orders", f"order-{n + i}".encode()) for i in range(4 if fast else 2)]
            client.send([*batch, Message("audit", f"audit-{n}".encode())])
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


def by(scrape: Scrape, name: str, keys: tuple[str, ...]) -> dict[str, float]:
    """sum by (keys) (name)"""
    out: dict[str, float] = defaultdict(float)
    for (sample, labels), value in scrape.items():
        if sample == name:
            label_map = dict(labels)
            out[",".join(label_map.get(k, "") for k in keys)] += value
    return out


def rates(samples: list[tuple[float, Scrape]], name: str, keys: tuple[str, ...],
          ) -> dict[str, list[tuple[float, float]]]:  # fmt: skip
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (t0, a), (t1, b) in itertools.pairwise(samples):
        before, after = by(a, name, keys), by(b, name, keys)
        for key, value in after.items():
            series[key].append((t1, max(value - before.get(key, 0.0), 0.0) / (t1 - t0)))
    return series


def levels(samples: list[tuple[float, Scrape]], name: str, keys: tuple[str, ...],
           ) -> dict[str, list[tuple[float, float]]]:  # fmt: skip
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for t, scraped in samples:
        for key, value in by(scraped, name, keys).items():
            series[key].append((t, value))
    return series


def p99(samples: list[tuple[float, Scrape]], name: str, key: str, skip: set[str],
        ) -> dict[str, list[tuple[float, float]]]:  # fmt: skip
    """histogram_quantile(0.99, sum by (le, key) (rate(name_bucket[interval])))"""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    bucket = f"{name}_bucket"
    for (_, a), (t1, b) in itertools.pairwise(samples):
        grouped: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
        for (sample, labels), value in b.items():
            label_map = dict(labels)
            if sample != bucket or label_map.get(key, "") in skip:
                continue
            le = float(label_map["le"])
            grouped[label_map.get(key, "")][le] += value - a.get((sample, labels), 0.0)
        for group, counts in grouped.items():
            ordered = sorted(counts.items())
            total = ordered[-1][1] if ordered else 0.0
            if total <= 0:
                continue
            target = 0.99 * total
            upper = next((le for le, count in ordered if count >= target), ordered[-1][0])
            if upper != float("inf"):
                series[group].append((t1, upper))
    return series


# -- plotting --------------------------------------------------------------------------------------


def plot(samples: list[tuple[float, Scrape]], out: Path, strategy: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = samples[0][0]
    panels = [
        ("Messages in by topic (msg/s)", rates(samples, "rocketmq_messages_in_total", ("topic",))),
        ("Messages out by group (msg/s)",
         rates(samples, "rocketmq_messages_out_total", ("consumer_group",))),
        ("Consumer lag (messages not acked)",
         levels(samples, "rocketmq_consumer_lag_messages", ("consumer_group", "topic"))),
        ("In flight (popped, not acked)",
         levels(samples, "rocketmq_consumer_inflight_messages", ("consumer_group", "topic"))),
        ("Sent to DLQ (total)",
         levels(samples, "rocketmq_send_to_dlq_messages_total", ("consumer_group",))),
        (f"Long polls by strategy ({strategy}) and empties (/s)", {
            **{f"long polls {k}": v for k, v in
               rates(samples, "popmq_proxy_long_polls_total", ("strategy",)).items()},
            **{f"empty {k}": v for k, v in
               rates(samples, "popmq_proxy_empty_responses_total", ("strategy",)).items()},
            **{f"false empty {k}": v for k, v in
               rates(samples, "popmq_proxy_false_empty_responses_total", ("strategy",)).items()},
        }),
        ("Broker RPCs from the proxy (/s)",
         rates(samples, "popmq_proxy_broker_rpcs_total", ("kind",))),
        ("RPC latency p99 without receive (ms)",
         p99(samples, "rocketmq_rpc_latency", "request_code", {"ReceiveMessage"})),
    ]  # fmt: skip
    figure, axes = plt.subplots(2, 4, figsize=(20, 8.5), constrained_layout=True)
    for axis, (title, series) in zip(axes.flat, panels, strict=True):
        axis.set_title(title, fontsize=11)
        for name, points in sorted(series.items()):
            if points and any(v for _, v in points):
                axis.plot([t - start for t, _ in points], [v for _, v in points],
                          label=name or "all", linewidth=1.4)  # fmt: skip
        axis.set_xlabel("seconds")
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8, loc="upper left")
    figure.suptitle("popmq dashboard: a real `popmq serve` (2 brokers) under a small load, "
                    "scraped every few seconds", fontsize=13)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)


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
        admin(endpoint, "topics", "create", "orders", "--queues", "2")
        admin(endpoint, "topics", "create", "audit", "--queues", "1")
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
    plot(samples, args.out, "adaptive")
    print(f"wrote {args.out} ({len(samples)} scrapes over {args.seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
