"""The chaos tests' duplicate classification (ha_kit.Traffic.classify_duplicates): the failover
test fails on "revived after an ack", so a duplicate with an innocent cause must not be put
there. Pure bookkeeping: no process, no client."""

from __future__ import annotations

from typing import Any

from chaos.ha_kit import Event, Traffic


def _traffic(*events: tuple[str, str, int]) -> Traffic:
    traffic = Traffic(client=Any, topic="t")  # type: ignore[arg-type]
    body = b"m"
    for at, (what, detail, attempt) in enumerate(events):
        traffic._note(body, Event(float(at), what, detail, attempt))
        if what == "acked":
            traffic.received[body] += 1
    return traffic


def test_a_send_stored_twice_whose_second_copy_is_revived_is_copied_twice() -> None:
    traffic = _traffic(
        ("delivered", "b/t/0@1", 1), ("acked", "", 0),  # one copy, acked
        ("delivered", "b/t/0@2", 1), ("ack failed", "leader gone", 0),  # the other, ack lost
        ("delivered", "b/%RETRY%cg+t/0@0", 2), ("acked", "", 0),  # the other's retry
    )  # fmt: skip
    assert traffic.classify_duplicates() == {"copied twice": [b"m"]}


def test_a_retry_after_the_only_copy_was_acked_is_revived_after_an_ack() -> None:
    traffic = _traffic(
        ("delivered", "b/t/0@1", 1), ("acked", "", 0),
        ("delivered", "b/%RETRY%cg+t/0@0", 2), ("acked", "", 0),
    )  # fmt: skip
    assert traffic.classify_duplicates() == {"revived after an ack": [b"m"]}


def test_the_same_copy_delivered_after_its_ack_is_revived_after_an_ack() -> None:
    traffic = _traffic(
        ("delivered", "b/t/0@1", 1), ("ack failed", "x", 0),
        ("delivered", "b/t/0@1", 1), ("acked", "", 0),
        ("delivered", "b/t/0@1", 1), ("acked", "", 0),
    )  # fmt: skip
    assert traffic.classify_duplicates() == {"revived after an ack": [b"m"]}
