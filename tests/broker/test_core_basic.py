import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.port import AdminPort, BrokerPort, MessagingPort
from popmq.broker.contract.types import AckEntry, Message, PopRequest, PopStatus
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker


def test_structurally_a_broker_port(tmp_path) -> None:
    """The Broker serves the messaging and admin views itself; LocalBrokerPort adds close()
    and a name to make it a whole BrokerPort."""
    broker = Broker(fast_broker_config(tmp_path))
    assert isinstance(broker, MessagingPort) and isinstance(broker, AdminPort)
    assert isinstance(LocalBrokerPort(broker), BrokerPort)


async def test_send_pop_ack_advances_offset(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        port = LocalBrokerPort(broker)
        sent = await port.send([Message("orders", f"m{i}".encode()) for i in range(5)], 1)
        assert [r.queue_offset for r in sent] == [0, 1, 2, 3, 4]
        assert all(r.broker_name == "broker-a" and r.queue_id == 1 for r in sent)
        result = await port.pop(PopRequest("g", "orders", max_messages=3, invisible_time_ms=5000))
        assert result.status == PopStatus.FOUND
        assert [p.message.body for p in result.messages] == [b"m0", b"m1", b"m2"]
        assert result.rest_num == 2
        acks = await port.ack("g", "orders", [AckEntry(p.receipt_handle) for p in result.messages])
        assert [a.code for a in acks] == [Code.OK] * 3
        assert await port.get_consumer_offset("g", "orders", 1) == 3
        rest = await port.pop(PopRequest("g", "orders", invisible_time_ms=5000))
        assert [p.message.body for p in rest.messages] == [b"m3", b"m4"]
        empty = await port.pop(PopRequest("g", "orders", invisible_time_ms=5000))
        assert empty.status == PopStatus.NO_MESSAGE and empty.messages == []
        await port.aclose()
        stats = await port.group_stats("g", "orders")
        assert [(s.queue_id, s.consumer_offset, s.max_offset, s.inflight) for s in stats][1] == (
            1,
            3,
            5,
            2,
        )


async def test_validation_errors(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path, max_invisible_ms=60_000)) as broker:
        cases = [
            (broker.send([Message("bad topic", b"x")]), Code.ILLEGAL_TOPIC),
            (broker.send([Message("%RETRY%g_t", b"x")]), Code.ILLEGAL_TOPIC),
            (broker.send([Message("t", b"")]), Code.MESSAGE_BODY_EMPTY),
            (
                broker.send([Message("t", b"x" * (4 * 1024 * 1024 + 1))]),
                Code.MESSAGE_BODY_TOO_LARGE,
            ),
            (broker.pop(PopRequest("g", "missing")), Code.TOPIC_NOT_FOUND),
        ]
        for call, code in cases:
            with pytest.raises(RefusedError) as err:
                await call
            assert err.value.code == code
        await broker.send([Message("t", b"x")])
        bad_pops = [
            (PopRequest("g g", "t"), Code.ILLEGAL_CONSUMER_GROUP),
            (PopRequest("g", "t", max_messages=33), Code.BAD_REQUEST),
            (PopRequest("g", "t", max_messages=0), Code.BAD_REQUEST),
            (PopRequest("g", "t", invisible_time_ms=0), Code.ILLEGAL_INVISIBLE_TIME),
            (PopRequest("g", "t", invisible_time_ms=60_001), Code.ILLEGAL_INVISIBLE_TIME),
            (PopRequest("g", "t", queue_id=9, invisible_time_ms=100), Code.BAD_REQUEST),
            (
                PopRequest("g", "t", invisible_time_ms=100, poll_time_ms=-1),
                Code.ILLEGAL_POLLING_TIME,
            ),
        ]
        for request, code in bad_pops:
            with pytest.raises(RefusedError) as err:
                await broker.pop(request)
            assert err.value.code == code, request
