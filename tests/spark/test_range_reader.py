"""read_range (what a Spark task runs) against the in-memory fake server: windows, data loss."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from popmq.broker.contract.types import Message
from support.fake_proxy import FakeProxy

from popmq.client import Client
from popmq.spark.options import Connection
from popmq.spark.partitions import PullSettings, QueueRange
from popmq.spark.range_reader import DataLossError, read_range

TOPIC = "orders"


@pytest.fixture
def fake() -> Iterator[FakeProxy]:
    # One broker, one queue: every message lands at the next offset of ("broker-a", 0).
    proxy = FakeProxy({TOPIC}, brokers=["broker-a"], queues_per_broker=1).start()
    with Client(proxy.endpoint) as client:
        client.send([Message(topic=TOPIC, body=f"{i}".encode()) for i in range(100)])
    try:
        yield proxy
    finally:
        proxy.stop()


def _range(fake: FakeProxy, start: int, end: int, **settings: object) -> QueueRange:
    base = {"pull_batch_size": 7, "fail_on_data_loss": True, "pull_concurrency": 3}
    base.update(settings)
    pull = PullSettings(
        Connection(fake.endpoint), TOPIC, base["pull_batch_size"], "*",  # type: ignore[arg-type]
        base["fail_on_data_loss"], "", base["pull_concurrency"],  # type: ignore[arg-type]
    )  # fmt: skip
    return QueueRange(pull, "broker-a", 0, start, end, bool(settings.get("from_earliest")))


def _offsets(part: QueueRange) -> list[int]:
    return [o for batch in read_range(part) for o in batch.column("offset").to_pylist()]


def test_windows_come_back_in_offset_order(fake: FakeProxy) -> None:
    assert _offsets(_range(fake, 3, 97)) == list(range(3, 97))
    assert _offsets(_range(fake, 0, 100, pull_concurrency=1, pull_batch_size=32)) == list(
        range(100)
    )
    assert fake.state.calls.count("PullMessage") == 14 + 4  # ceil(94/7) + ceil(100/32)


def test_purged_offsets_fail_or_are_skipped(fake: FakeProxy) -> None:
    fake.state.purged[(TOPIC, "broker-a", 0)] = 40
    with pytest.raises(DataLossError, match=r"30 message\(s\) .* from offset 10 are gone"):
        _offsets(_range(fake, 10, 60))
    assert _offsets(_range(fake, 10, 60, fail_on_data_loss=False)) == list(range(40, 60))
    # A queue the stream met after it started is read "from the beginning": no loss.
    assert _offsets(_range(fake, 0, 45, from_earliest=True)) == list(range(40, 45))
    assert _offsets(_range(fake, 10, 30, fail_on_data_loss=False)) == []


def test_a_queue_shorter_than_the_range(fake: FakeProxy) -> None:
    with pytest.raises(DataLossError, match="was the topic recreated"):
        _offsets(_range(fake, 90, 120))
    assert _offsets(_range(fake, 90, 120, fail_on_data_loss=False)) == list(range(90, 100))
