"""The proxy's transaction check-back loop on virtual time (looptime): undecided half messages
go to a live producer of their topic after the check immunity, again every check interval,
never to a producer of another topic; an unknown answer is asked again, and after max_checks
the broker parks the message. The producer's answer (EndTransaction SOURCE_SERVER_CHECK)
decides it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from popmq.broker.contract.types import PROP_TRANSACTION, AckEntry, Message, PopRequest
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.core.transactions import OrphanCheck, ProducerChannels, Transactions
from popmq.proxy.metrics import ProxyMetrics

from popmq.clock import LoopClock

pytestmark = pytest.mark.looptime


@pytest.fixture
async def setup(tmp_path) -> AsyncIterator[tuple]:
    config = fast_broker_config(tmp_path, revive_scan_interval_ms=1_000, checkpoint_buffer_ms=1_000)
    config = config.model_copy(
        update={"store": config.store.model_copy(update={"flush_interval_ms": 1_000})}
    )
    config = config.model_copy(update={"transaction": type(config.transaction)(
        check_immunity_ms=6_000, check_interval_ms=30_000, max_checks=3)})  # fmt: skip
    async with running_broker(config, LoopClock()) as broker:
        await broker.create_topic("tx", 1, "TRANSACTION")
        cluster = BrokerCluster([LocalBrokerPort(broker)])
        metrics = ProxyMetrics()
        yield broker, Transactions(cluster, ProducerChannels(), metrics), metrics


async def _half(broker, body: bytes):
    (sent,) = await broker.send([Message("tx", body, properties={PROP_TRANSACTION: "1"})])
    return sent


async def _bodies(broker) -> list[bytes]:
    result = await broker.pop(PopRequest("g", "tx", max_messages=32))
    if result.messages:
        await broker.ack("g", "tx", [AckEntry(p.receipt_handle) for p in result.messages])
    return sorted(p.message.body for p in result.messages)


async def test_a_check_goes_to_a_producer_of_the_topic_and_its_answer_decides(setup) -> None:
    broker, transactions, metrics = setup
    mine: list[OrphanCheck] = []
    other: list[OrphanCheck] = []
    transactions.channels.open("other", {"elsewhere"}, lambda c: other.append(c) or True)
    sent = await _half(broker, b"unknown")
    assert await transactions.check_once() == 0  # nobody produces "tx" here
    transactions.channels.open("mine", {"tx"}, lambda c: mine.append(c) or True)
    assert await transactions.check_once() == 0  # still immune
    await anyio.sleep(6.1)
    assert await transactions.check_once() == 1
    (check,) = mine
    assert other == []
    assert (check.message.message_id, check.message.topic, check.message.body) == (
        sent.message_id, "tx", b"unknown")  # fmt: skip
    assert await transactions.check_once() == 0  # not again within the check interval
    await transactions.end("tx", check.message.message_id, check.transaction_id, "COMMIT",
                           "SERVER_CHECK")  # fmt: skip
    assert await _bodies(broker) == [b"unknown"]
    assert metrics.registry.get_sample_value("popmq_proxy_transaction_checks_total") == 1


async def test_unknown_answers_are_asked_again_then_parked(setup) -> None:
    broker, transactions, _ = setup
    seen: list[OrphanCheck] = []
    transactions.channels.open("p", {"tx"}, lambda c: seen.append(c) or True)
    await _half(broker, b"undecided")
    await anyio.sleep(6.1)
    for asked in (1, 2, 3):
        assert await transactions.check_once() == 1
        (check,) = seen[-1:]
        await transactions.end("tx", check.message.message_id, check.transaction_id,
                               "TRANSACTION_RESOLUTION_UNSPECIFIED", "SERVER_CHECK")  # fmt: skip
        assert len(seen) == asked
        await anyio.sleep(30.1)
    assert await transactions.check_once() == 0  # parked after 3 checks
    (info,) = await broker.list_transactions()
    assert info.parked and info.checks == 3
    assert await _bodies(broker) == []


async def test_a_gone_stream_does_not_take_the_check(setup) -> None:
    broker, transactions, _ = setup
    transactions.channels.open("dead", {"tx"}, lambda c: False)  # closed meanwhile
    await _half(broker, b"x")
    await anyio.sleep(6.1)
    assert await transactions.check_once() == 0
    transactions.channels.close("dead")
    live: list[OrphanCheck] = []
    transactions.channels.open("live", {"tx"}, lambda c: live.append(c) or True)
    await anyio.sleep(30.1)  # the next interval asks again
    assert await transactions.check_once() == 1 and len(live) == 1
