"""Transactional messages at the broker (RocketMQ 5's half messages and op records): a half
message is invisible until committed, commit delivers it once with its id, keys, tag and
properties, rollback discards it, both are idempotent and durable across restarts, and the
check-back claims undecided ones after their immunity, every interval, up to max_checks, then
parks them. Virtual time (looptime, the broker on a LoopClock)."""

import anyio
import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import (
    PROP_CHECK_IMMUNITY,
    PROP_TRANSACTION,
    AckEntry,
    Message,
    PopRequest,
)
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.broker.transactions import HALF_TOPIC, PARK, PARKED_TOPIC, PROGRESS_GROUP

from popmq.clock import LoopClock
from popmq.config import BrokerConfig

pytestmark = pytest.mark.looptime


def _config(tmp_path, **tx) -> BrokerConfig:
    # Slow background scans: the virtual minutes here would cost thousands of 10 ms loops.
    config = fast_broker_config(tmp_path, revive_scan_interval_ms=1_000, checkpoint_buffer_ms=1_000)
    config = config.model_copy(
        update={"store": config.store.model_copy(update={"flush_interval_ms": 1_000})}
    )
    settings = {"check_immunity_ms": 6_000, "check_interval_ms": 30_000, "max_checks": 3}
    settings.update(tx)
    return config.model_copy(update={"transaction": type(config.transaction)(**settings)})


def _half(body: bytes, topic: str = "tx", **properties: str) -> Message:
    return Message(topic, body, tag="TagA", keys=["k1", "k2"],
                   properties={PROP_TRANSACTION: "1", "color": "red", **properties})  # fmt: skip


async def _pop(broker, topic: str = "tx") -> list:
    result = await broker.pop(PopRequest("g", topic, max_messages=32, invisible_time_ms=60_000))
    if result.messages:
        await broker.ack("g", topic, [AckEntry(p.receipt_handle) for p in result.messages])
    return [p.message for p in result.messages]


async def _refused(call, code: Code) -> RefusedError:
    with pytest.raises(RefusedError) as err:
        await call
    assert err.value.code == code, err.value
    return err.value


def _sample(broker, name: str, **labels: str) -> float:
    value = broker.metrics.registry.get_sample_value(name, {"broker": broker.name, **labels})
    return value or 0.0


async def test_commit_delivers_once_with_its_identity(tmp_path) -> None:
    async with running_broker(_config(tmp_path), LoopClock()) as broker:
        await broker.create_topic("tx", 2, "TRANSACTION")
        (sent,) = await broker.send([_half(b"order-1")])
        assert sent.transaction_id.startswith("t1.") and sent.queue_offset == -1
        assert await _pop(broker) == []  # a half message is invisible
        await broker.end_transaction("tx", sent.message_id, sent.transaction_id, True)
        await broker.end_transaction("tx", sent.message_id, sent.transaction_id, True)  # repeat
        (got,) = await _pop(broker)
        assert (got.body, got.message_id, got.tag, got.keys) == (
            b"order-1", sent.message_id, "TagA", ["k1", "k2"])  # fmt: skip
        assert got.properties["color"] == "red" and got.topic == "tx"
        assert await _pop(broker) == []  # once
        err = await _refused(
            broker.end_transaction("tx", sent.message_id, sent.transaction_id, False),
            Code.INVALID_TRANSACTION_ID,
        )
        assert "already committed" in err.message
        assert _sample(broker, "popmq_broker_transactions_ended_total",
                       resolution="COMMIT", source="CLIENT") == 1  # fmt: skip
        assert _sample(broker, "popmq_broker_transaction_half_messages_total") == 1
        assert broker.transactions.pending == 0


async def test_rollback_discards_and_is_idempotent(tmp_path) -> None:
    async with running_broker(_config(tmp_path), LoopClock()) as broker:
        await broker.create_topic("tx", 1, "TRANSACTION")
        (sent,) = await broker.send([_half(b"gone")])
        await broker.end_transaction("tx", sent.message_id, sent.transaction_id, False)
        await broker.end_transaction("tx", sent.message_id, sent.transaction_id, False)
        await _refused(broker.end_transaction("tx", sent.message_id, sent.transaction_id, True),
                       Code.INVALID_TRANSACTION_ID)  # fmt: skip
        await anyio.sleep(120)
        assert await _pop(broker) == []
        assert await broker.claim_transaction_checks(["tx"]) == []


async def test_bad_transaction_ids_are_refused(tmp_path) -> None:
    async with running_broker(_config(tmp_path), LoopClock()) as broker:
        await broker.create_topic("tx", 1, "TRANSACTION")
        await broker.create_topic("other", 1, "TRANSACTION")
        (sent,) = await broker.send([_half(b"x")])
        tid = sent.transaction_id
        for bad in ("", "nonsense", tid[:-4] + "AAAA", "t1.YnJva2VyLWE.k.abc"):
            await _refused(broker.end_transaction("tx", sent.message_id, bad, True),
                           Code.INVALID_TRANSACTION_ID)  # fmt: skip
        await _refused(broker.end_transaction("other", sent.message_id, tid, True),
                       Code.INVALID_TRANSACTION_ID)  # fmt: skip
        await _refused(broker.end_transaction("tx", "another-id", tid, True),
                       Code.INVALID_TRANSACTION_ID)  # fmt: skip
        assert await _pop(broker) == []  # nothing was committed by the bad calls
        await broker.end_transaction("tx", sent.message_id, tid, True)
        assert len(await _pop(broker)) == 1


async def test_a_transactional_message_needs_a_topic_that_takes_it(tmp_path) -> None:
    async with running_broker(_config(tmp_path), LoopClock()) as broker:
        await broker.create_topic("plain", 1, "NORMAL")
        await _refused(broker.send([_half(b"x", "plain")]),
                       Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)  # fmt: skip
        await broker.create_topic("mixed", 1, "MIXED")
        (sent,) = await broker.send([_half(b"x", "mixed")])
        assert sent.transaction_id


async def test_halves_and_decisions_survive_a_restart(tmp_path) -> None:
    config = _config(tmp_path)
    async with running_broker(config, LoopClock()) as broker:
        await broker.create_topic("tx", 1, "TRANSACTION")
        committed, rolled, open_ = await broker.send([_half(b"c"), _half(b"r"), _half(b"o")])
        await broker.end_transaction("tx", committed.message_id, committed.transaction_id, True)
        await broker.end_transaction("tx", rolled.message_id, rolled.transaction_id, False)
    async with running_broker(config, LoopClock()) as broker:
        assert [h.message_id for h in broker.transactions.halves()] == [open_.message_id]
        # Decisions are remembered: repeats are fine, contrary ones refused.
        await broker.end_transaction("tx", committed.message_id, committed.transaction_id, True)
        await _refused(
            broker.end_transaction("tx", rolled.message_id, rolled.transaction_id, True),
            Code.INVALID_TRANSACTION_ID,
        )
        await broker.end_transaction("tx", open_.message_id, open_.transaction_id, True)
        assert sorted(m.body for m in await _pop(broker)) == [b"c", b"o"]
    async with running_broker(config, LoopClock()) as broker:
        assert broker.transactions.pending == 0
        assert await _pop(broker) == []
        # All three decided: the half topic's progress is past them (recovery reads no more).
        progress = broker.transactions._store.get_consumer_offset(PROGRESS_GROUP, HALF_TOPIC, 0)
        assert progress == 3


async def test_check_back_timing_and_parking(tmp_path) -> None:
    config = _config(tmp_path, check_immunity_ms=6_000, check_interval_ms=30_000, max_checks=3)
    async with running_broker(config, LoopClock()) as broker:
        await broker.create_topic("tx", 1, "TRANSACTION")
        (sent,) = await broker.send([_half(b"unknown")])
        sent_ms = broker.transactions.halves()[0].stored_ms
        assert await broker.claim_transaction_checks(["tx"]) == []  # immune for 6 s
        await anyio.sleep(6.1)
        assert await broker.claim_transaction_checks(["elsewhere"]) == []  # not its topic
        (check,) = await broker.claim_transaction_checks(["tx"])
        assert (check.message.message_id, check.message.topic, check.checks) == (
            sent.message_id, "tx", 1)  # fmt: skip
        assert check.message.body == b"unknown" and check.message.properties["color"] == "red"
        assert "__popmq.tx_topic" not in check.message.properties
        assert await broker.claim_transaction_checks(["tx"]) == []  # claimed: not again yet
        for expected in (2, 3):
            await anyio.sleep(30.1)
            (check,) = await broker.claim_transaction_checks(["tx"])
            assert check.checks == expected
        await anyio.sleep(30.1)
        assert await broker.claim_transaction_checks(["tx"]) == []  # parked instead
        (info,) = await broker.list_transactions()
        assert info.parked and info.checks == 3 and info.message_id == sent.message_id
        assert _sample(broker, "popmq_broker_transactions_parked_total") == 1
        assert _sample(broker, "popmq_broker_transaction_checks_total") == 3
        # Moved to the parked topic: the half topic's progress is past it.
        store = broker.transactions._store
        assert store.max_offset(PARKED_TOPIC, 0) == 1
        assert store.get_consumer_offset(PROGRESS_GROUP, HALF_TOPIC, 0) == 1
    async with running_broker(config, LoopClock()) as broker:  # parked and counted, durably
        (info,) = await broker.list_transactions()
        assert info.parked and info.checks == 3
        assert info.stored_ms == sent_ms
        # An operator (or a late producer) still decides it, with the id the listing shows.
        await broker.end_transaction("tx", info.message_id, info.transaction_id, True, "ADMIN")
        assert [m.body for m in await _pop(broker)] == [b"unknown"]


async def test_check_answered_by_the_checks_transaction_id(tmp_path) -> None:
    async with running_broker(_config(tmp_path, check_immunity_ms=0), LoopClock()) as broker:
        await broker.create_topic("tx", 1, "TRANSACTION")
        (sent,) = await broker.send([_half(b"late")])
        await anyio.sleep(0.01)
        (check,) = await broker.claim_transaction_checks(["tx"])
        await broker.end_transaction(
            "tx", check.message.message_id, check.transaction_id, False, "SERVER_CHECK"
        )
        await _refused(broker.end_transaction("tx", sent.message_id, sent.transaction_id, True),
                       Code.INVALID_TRANSACTION_ID)  # fmt: skip
        assert _sample(broker, "popmq_broker_transactions_ended_total",
                       resolution="ROLLBACK", source="SERVER_CHECK") == 1  # fmt: skip


async def test_immunity_property_lengthens_but_never_shortens(tmp_path) -> None:
    async with running_broker(_config(tmp_path), LoopClock()) as broker:
        await broker.create_topic("tx", 1, "TRANSACTION")
        await broker.send([_half(b"long", **{PROP_CHECK_IMMUNITY: "60"})])
        await broker.send([_half(b"short", **{PROP_CHECK_IMMUNITY: "1"})])
        await anyio.sleep(6.1)
        assert [c.message.body for c in await broker.claim_transaction_checks(["tx"])] == [b"short"]
        await anyio.sleep(20)  # 26 s: still immune
        assert await broker.claim_transaction_checks(["tx"]) == []
        await anyio.sleep(34.1)
        checked = [c.message.body for c in await broker.claim_transaction_checks(["tx"])]
        assert b"long" in checked


async def test_halves_nobody_is_asked_about_are_parked(tmp_path) -> None:
    config = _config(tmp_path, check_immunity_ms=1_000, check_interval_ms=1_000, max_checks=2)
    async with running_broker(config, LoopClock()) as broker:
        await broker.create_topic("tx", 1, "TRANSACTION")
        await broker.send([_half(b"orphan")])
        await anyio.sleep(10)  # no proxy claimed it: the broker's own loop parks it
        (info,) = await broker.list_transactions()
        assert info.parked and info.checks == 0


async def test_halves_parked_in_place_by_older_versions_still_work(tmp_path) -> None:
    """Before the parked topic, a PARK op record alone marked a half message parked, which
    stayed in the half topic. Such data directories load: the halves are listed as parked,
    decided from the half topic, and moved to the parked topic by the broker's loop."""
    config = _config(tmp_path, check_interval_ms=30_000)
    async with running_broker(config, LoopClock()) as broker:
        await broker.create_topic("tx", 1, "TRANSACTION")
        early, late = await broker.send([_half(b"early"), _half(b"late")])
        service = broker.transactions
        for half in service.halves():  # what the older version wrote when it parked
            await service._op(half.offset, half.message_id, PARK)
    async with running_broker(config, LoopClock()) as broker:
        service = broker.transactions
        store = service._store
        assert [(i.message_id, i.parked) for i in await broker.list_transactions()] == [
            (early.message_id, True), (late.message_id, True)]  # fmt: skip
        # Decided at once, read from the half topic (the loop may not have moved it yet).
        await broker.end_transaction("tx", early.message_id, early.transaction_id, True, "ADMIN")
        await anyio.sleep(31)  # one round of the broker's transaction loop
        (half,) = service.halves()
        assert half.parked and half.parked_offset is not None
        assert store.max_offset(PARKED_TOPIC, 0) == 1
        assert store.get_consumer_offset(PROGRESS_GROUP, HALF_TOPIC, 0) == 2
        assert _sample(broker, "popmq_broker_transactions_parked_total") == 0  # not new
    async with running_broker(config, LoopClock()) as broker:
        (info,) = await broker.list_transactions()
        assert info.parked and info.message_id == late.message_id
        await broker.end_transaction("tx", late.message_id, late.transaction_id, True, "ADMIN")
        assert sorted(m.body for m in await _pop(broker)) == [b"early", b"late"]
        assert broker.transactions.pending == 0
