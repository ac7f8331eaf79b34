"""PushConsumer auto-renew (issue 13, item 5): the proxy keeps a message invisible while the
official PushConsumer's handler is still working on it, past the invisible time slice."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.official_clients import ClientSession, PopmqProcess, serve, unique

pytestmark = [pytest.mark.client, pytest.mark.slow]

SLICE_S = 2  # each pop / renewal holds the message this long
HANDLER_S = 3 * SLICE_S + 1  # the handler outlives the slice several times
RENEW_SETTINGS = [
    f"proxy.renew_slice_ms={SLICE_S * 1000}",
    "proxy.renew_ahead_ms=1500",  # a loaded CI machine may stall the proxy for most of 1 s
    "proxy.renew_schedule_period_ms=100",
    # Without renewal a push receive would get this, once: the same single slice.
    f"proxy.default_invisible_ms={SLICE_S * 1000}",
]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, int]]:
    process: PopmqProcess = serve(
        tmp_path / "data", brokers=1, extra=RENEW_SETTINGS, extra_args=["--metrics-port", "0"]
    )
    port = process.wait_listening()
    metrics = [re.search(r"popmq metrics on [\w.]+:(\d+)", line) for line in process.reader.seen]
    yield f"127.0.0.1:{port}", next(int(m.group(1)) for m in metrics if m)
    assert process.stop() == 0


def _renewals(metrics_port: int) -> dict[str, float]:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    found = re.findall(r'popmq_proxy_auto_renewals_total\{outcome="(\w+)"\} ([\d.e+]+)', text)
    return {outcome: float(value) for outcome, value in found}


def test_a_slow_push_handler_keeps_its_message(
    server: tuple[str, int], open_client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    endpoint, metrics_port = server
    topic, group = unique("renew"), unique("g")
    producer: ClientSession = open_client(endpoint, "producer", topics=[topic])
    slow = open_client(endpoint, "push", topics=[topic], group=group, sleep_s=HANDLER_S)
    other = open_client(endpoint, "simple", topics=[topic], group=group, await_s=1)
    assert producer.call("send", messages=[{"body": "slow"}])["results"][0]["ok"]

    started = slow.call("push_started", count=1, timeout_s=30)["started"]
    assert len(started) == 1
    # While the handler works (well past one slice), nobody else in the group gets it.
    during = other.call("receive_until", count=1, timeout_s=HANDLER_S - 1, invisible_s=5)
    assert during["messages"] == [], during
    assert during["calls"] >= 2  # it really kept asking

    done = slow.call("push_collect", count=1, timeout_s=30)["consumed"]
    assert [(r["body"], r["result"]) for r in done] == [("slow", "SUCCESS")]
    # The PushConsumer acked with the handle it received; the proxy acked the renewed one, so
    # the message does not come back after the last slice either.
    after = other.call("receive_until", count=1, timeout_s=2 * SLICE_S + 1, invisible_s=5)
    assert after["messages"] == [], after
    again = slow.call("push_collect", count=2, timeout_s=1)["consumed"]
    assert len(again) == 1  # and not to the slow consumer itself

    renewals = _renewals(metrics_port)
    assert renewals.get("renewed", 0) >= 2, renewals
