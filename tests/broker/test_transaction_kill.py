"""Transactional half messages and decisions survive a kill -9 of a real `popmq broker`
process (asynchronous flush: a process crash loses nothing), used over the gRPC broker port."""

from __future__ import annotations

from pathlib import Path

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import PROP_TRANSACTION, AckEntry, Message, PopRequest
from popmq.broker.wire.remote import RemoteBrokerPort
from support.broker_process import BrokerProcess

pytestmark = pytest.mark.subprocess


def _half(body: bytes) -> Message:
    return Message("tx", body, keys=[body.decode()], properties={PROP_TRANSACTION: "1"})


async def _bodies(port: RemoteBrokerPort, group: str) -> list[bytes]:
    result = await port.pop(PopRequest(group, "tx", max_messages=32, poll_time_ms=500))
    if result.messages:
        await port.ack(group, "tx", [AckEntry(p.receipt_handle) for p in result.messages])
    return sorted(p.message.body for p in result.messages)


async def test_halves_and_decisions_survive_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    process = BrokerProcess(data, "broker-a", tmp_path / "broker.log", flush="async")
    port: RemoteBrokerPort | None = None
    try:
        await process.start()
        port = RemoteBrokerPort("broker-a", process.address)
        await port.create_topic("tx", 2, "TRANSACTION")
        committed, rolled, open_ = await port.send([_half(b"c"), _half(b"r"), _half(b"o")])
        await port.end_transaction("tx", committed.message_id, committed.transaction_id, True)
        await port.end_transaction("tx", rolled.message_id, rolled.transaction_id, False)
        await process.kill()
        await port.aclose()

        await process.start()
        port = RemoteBrokerPort("broker-a", process.address)
        (half,) = await port.list_transactions()
        assert half.message_id == open_.message_id and not half.parked
        # The decisions taken before the kill hold: repeats are OK, a contrary one refused.
        await port.end_transaction("tx", committed.message_id, committed.transaction_id, True)
        await port.end_transaction("tx", rolled.message_id, rolled.transaction_id, False)
        with pytest.raises(RefusedError) as err:
            await port.end_transaction("tx", rolled.message_id, rolled.transaction_id, True)
        assert err.value.code == Code.INVALID_TRANSACTION_ID
        assert await _bodies(port, "g1") == [b"c"]  # the open one is still a half message
        await port.end_transaction("tx", open_.message_id, half.transaction_id, True)
        assert await _bodies(port, "g1") == [b"o"]
        await process.kill()
        await port.aclose()

        await process.start()
        port = RemoteBrokerPort("broker-a", process.address)
        assert await port.list_transactions() == []
        assert await _bodies(port, "g2") == [b"c", b"o"]  # each delivered once, none lost
    finally:
        if port is not None:
            await port.aclose()
        await process.kill()
