"""OpenTelemetry spans of a transactional message: the half send, each check-back and the
commit or rollback are tied together. The half send's span is kept with the half message; each
check (at the proxy) and the parking (at the broker) join its trace, and the decision's span,
in the trace of whoever decided (the producer's EndTransaction), links to it. In-memory
exporter, virtual time."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from popmq.broker.contract.types import PROP_TRANSACTION, AckEntry, Message, PopRequest
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.core.transactions import OrphanCheck, ProducerChannels, Transactions
from popmq.proxy.metrics import ProxyMetrics

from popmq.clock import LoopClock

pytestmark = pytest.mark.looptime

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def provider() -> Iterator[TracerProvider]:
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):  # set by an earlier module: add our exporter
        provider = current
    else:
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    yield provider


@pytest.fixture
async def setup(provider: TracerProvider, tmp_path) -> AsyncIterator[tuple]:
    config = fast_broker_config(tmp_path, revive_scan_interval_ms=1_000, checkpoint_buffer_ms=1_000)
    config = config.model_copy(update={
        "store": config.store.model_copy(update={"flush_interval_ms": 1_000}),
        "transaction": type(config.transaction)(
            check_immunity_ms=6_000, check_interval_ms=30_000, max_checks=2),
    })  # fmt: skip
    async with running_broker(config, LoopClock()) as broker:
        await broker.create_topic("tx", 1, "TRANSACTION")
        transactions = Transactions(BrokerCluster([LocalBrokerPort(broker)]),
                                    ProducerChannels(), ProxyMetrics())  # fmt: skip
        EXPORTER.clear()
        yield broker, transactions


def _spans(name: str) -> list[ReadableSpan]:
    return [s for s in EXPORTER.get_finished_spans() if s.name == name]


def _linked_to(span: ReadableSpan, target: ReadableSpan) -> bool:
    return any(link.context.span_id == target.context.span_id for link in span.links)


async def test_checks_join_the_half_send_trace_and_the_commit_links_to_it(setup) -> None:
    broker, transactions = setup
    client = trace.get_tracer("the-producer")
    seen: list[OrphanCheck] = []
    transactions.channels.open("p", {"tx"}, lambda c: seen.append(c) or True)
    with client.start_as_current_span("producer send") as send:
        (sent,) = await broker.send([Message("tx", b"x", properties={PROP_TRANSACTION: "1"})])
    (half,) = _spans("popmq.transaction.half")
    assert half.context.trace_id == send.get_span_context().trace_id
    await anyio.sleep(6.1)
    assert await transactions.check_once() == 1
    await anyio.sleep(30.1)
    assert await transactions.check_once() == 1
    checks = _spans("popmq.transaction.check")
    assert len(checks) == 2
    for check in checks:  # each check is in the half send's trace, under it and linked
        assert check.context.trace_id == half.context.trace_id
        assert check.parent is not None and check.parent.span_id == half.context.span_id
        assert _linked_to(check, half)
        assert check.attributes["messaging.message.id"] == sent.message_id
        assert check.attributes["popmq.transaction.handed_over"] is True
    assert [c.attributes["popmq.transaction.checks"] for c in checks] == [1, 2]
    # The producer's checker answers COMMIT, in a trace of its own.
    with client.start_as_current_span("checker answers") as answer:
        await transactions.end("tx", sent.message_id, seen[-1].transaction_id, "COMMIT",
                               "SERVER_CHECK")  # fmt: skip
    (commit,) = _spans("popmq.transaction.commit")
    assert commit.context.trace_id == answer.get_span_context().trace_id
    assert _linked_to(commit, half)
    assert commit.attributes["popmq.transaction.source"] == "SERVER_CHECK"
    # The committed message does not carry the half's trace on.
    result = await broker.pop(PopRequest("g", "tx", max_messages=4))
    (popped,) = result.messages
    assert not any(k.startswith("__popmq.tx_") for k in popped.message.properties)
    await broker.ack("g", "tx", [AckEntry(popped.receipt_handle)])


async def test_rollback_and_parking_spans_link_to_the_half_send(setup) -> None:
    broker, _ = setup
    client = trace.get_tracer("the-producer")
    with client.start_as_current_span("producer send"):
        rolled, parked = await broker.send(
            [Message("tx", b, properties={PROP_TRANSACTION: "1"}) for b in (b"r", b"p")]
        )
    (half,) = _spans("popmq.transaction.half")
    await broker.end_transaction("tx", rolled.message_id, rolled.transaction_id, False)
    (rollback,) = _spans("popmq.transaction.rollback")
    assert _linked_to(rollback, half)
    await anyio.sleep(6.1 + 4 * 30.1)  # nobody was asked (no producer): the loop parks it
    (park,) = _spans("popmq.transaction.park")
    assert park.context.trace_id == half.context.trace_id and _linked_to(park, half)
    assert park.attributes["messaging.message.id"] == parked.message_id
