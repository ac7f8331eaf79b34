"""A proxy killed with kill -9 between a transactional send and its commit loses nothing: two
`popmq proxy` processes in front of one `popmq broker`, an official Python producer on each;
the half messages are sent through proxy 0, which is then killed before the producer commits.
The check-back goes through proxy 1 to the producer there, whose TransactionChecker decides:
the committed message is delivered exactly once, the rolled-back one never, and nothing is
delivered before the checker's decision."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.official_clients import (
    CLIENT_PYTHON,
    SERVER_SETTINGS,
    ClientSession,
    PopmqProcess,
    unique,
)

pytestmark = [
    pytest.mark.wallclock,
    pytest.mark.client,
    pytest.mark.subprocess,
    pytest.mark.skipif(
        not CLIENT_PYTHON.exists(),
        reason="the official client venv .venv-client is missing: run `make client-venv`",
    ),
]

OpenClient = Callable[..., ClientSession]
IMMUNITY_MS = 2_000  # the broker's check immunity: short, so the check comes soon


def _sets(settings: list[str]) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


@pytest.fixture
def two_proxies(tmp_path: Path) -> Iterator[list[tuple[PopmqProcess, str]]]:
    broker_sets = [s for s in SERVER_SETTINGS if s.startswith("broker.")]
    broker_sets += [f"broker.transaction.check_immunity_ms={IMMUNITY_MS}",
                    "broker.transaction.check_interval_ms=1000"]  # fmt: skip
    broker = PopmqProcess(["broker", "--name", "broker-a", "--port", "0", "--data-dir",
                           str(tmp_path / "broker-a"), *_sets(broker_sets)],
                          tmp_path / "broker-a.log")  # fmt: skip
    processes = [broker]
    try:
        address = f"broker-a=127.0.0.1:{broker.wait_listening('broker')}"
        proxy_sets = _sets([*SERVER_SETTINGS, "proxy.transaction_check_poll_ms=200"])
        proxy_args = ["proxy", "--port", "0", "--broker", address, *proxy_sets]
        # Both start at once.
        proxies = [PopmqProcess(proxy_args, tmp_path / f"proxy-{i}.log") for i in range(2)]
        processes += proxies
        yield [(proxy, f"127.0.0.1:{proxy.wait_listening()}") for proxy in proxies]
    finally:  # kill -9 (a graceful stop is tested elsewhere; this saves seconds)
        for process in reversed(processes):
            if process.process.poll() is None:
                process.process.kill()
                process.process.wait(10)
            process.stop()  # closes the log


def _ok(answer: dict) -> dict:
    assert answer.get("ok"), answer
    return answer


def test_check_back_goes_through_the_other_proxy_after_kill_9(
    two_proxies: list[tuple[PopmqProcess, str]], open_client: OpenClient
) -> None:
    (proxy_0, endpoint_0), (_, endpoint_1) = two_proxies
    topic, group = unique("txkill"), unique("g")
    consumer = open_client(endpoint_1, "simple", topics=[topic], group=group, await_s=1)
    sender = open_client(endpoint_0, "producer", topics=[topic], transactional=True)
    checker = open_client(endpoint_1, "producer", topics=[topic], transactional=True)
    sent = {
        body: _ok(sender.call("tx_send", topic=topic, message={"body": body}, end="none"))
        for body in ("k-commit", "k-roll")
    }
    proxy_0.process.kill()  # SIGKILL, before the producer commits
    proxy_0.process.wait(10)
    # Nothing is delivered while the transactions are open (the checker has no answer yet).
    got = _ok(consumer.call("receive_until", count=1, timeout_s=1))["messages"]
    assert got == []
    decided_ms = time.time() * 1000
    _ok(checker.call("set_decisions", decisions={"k-commit": "COMMIT", "k-roll": "ROLLBACK"}))
    checked = _ok(checker.call("checked", count=2, timeout_s=30))["checked"]
    assert {(c["body"], c["message_id"]) for c in checked} >= {
        (body, answer["message_id"]) for body, answer in sent.items()}  # fmt: skip
    got = _ok(consumer.call("receive_until", count=2, timeout_s=2.5))["messages"]
    assert [(m["body"], m["message_id"]) for m in got] == [
        ("k-commit", sent["k-commit"]["message_id"])
    ]  # exactly once; the rolled-back never
    assert got[0]["received_at_ms"] >= decided_ms  # not before the checker could commit it
