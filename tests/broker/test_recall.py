"""Recall of delay messages (RocketMQ 5's RecallMessage) at the broker: a recall before the
delivery time cancels the delivery, durably; after it, NOT_FOUND; a forged, altered, foreign
or other-topic handle is refused."""

import anyio
import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import AckEntry, Message, PopRequest
from popmq.broker.testing import fast_broker_config, running_broker

from popmq.clock import LoopClock

# Virtual time (looptime, the brokers on a LoopClock): the delays pass without waiting.
pytestmark = pytest.mark.looptime

# The delay before delivery: every recall and "not due yet" check lands inside it (the polls
# that take the kept message wait for it: they return as soon as it is due).
DELAY_MS = 2_500


@pytest.fixture
def clock() -> LoopClock:
    return LoopClock()


def _delayed(clock: LoopClock, topic: str, body: bytes, delay_ms: int) -> Message:
    return Message(topic, body, delivery_timestamp_ms=clock.now_ms() + delay_ms)


async def _bodies(broker, topic: str, poll_ms: int) -> list[bytes]:
    request = PopRequest("g", topic, max_messages=32, invisible_time_ms=60_000,
                         poll_time_ms=poll_ms)  # fmt: skip
    result = await broker.pop(request)
    if result.messages:
        await broker.ack("g", topic, [AckEntry(p.receipt_handle) for p in result.messages])
    return sorted(p.message.body for p in result.messages)


async def _refused(call, code: Code) -> RefusedError:
    with pytest.raises(RefusedError) as err:
        await call
    assert err.value.code == code, err.value
    return err.value


async def test_recall_before_delivery_cancels_it(tmp_path, clock) -> None:
    async with running_broker(fast_broker_config(tmp_path), clock) as broker:
        await broker.create_topic("d", 2, "DELAY")
        keep, drop = await broker.send(
            [_delayed(clock, "d", b"keep", DELAY_MS), _delayed(clock, "d", b"drop", DELAY_MS)]
        )
        assert (
            keep.recall_handle and drop.recall_handle and keep.recall_handle != drop.recall_handle
        )
        assert await broker.recall("d", drop.recall_handle) == drop.message_id
        assert await broker.recall("d", drop.recall_handle) == drop.message_id  # idempotent
        recalled = broker.metrics.registry.get_sample_value(
            "popmq_broker_messages_recalled_total", {"broker": broker.name}
        )
        assert recalled == 1
        assert await _bodies(broker, "d", 0) == []  # not due yet
        assert await _bodies(broker, "d", DELAY_MS + 10_000) == [b"keep"]
        await anyio.sleep(0.3)
        assert await _bodies(broker, "d", 300) == []  # the recalled one never comes
        # Once delivered, nothing is left to recall.
        err = await _refused(broker.recall("d", keep.recall_handle), Code.NOT_FOUND)
        assert keep.message_id in err.message


async def test_a_recall_survives_a_restart(tmp_path, clock) -> None:
    config = fast_broker_config(tmp_path)
    async with running_broker(config, clock) as broker:
        await broker.create_topic("d", 1, "DELAY")
        _, drop = await broker.send(
            [_delayed(clock, "d", b"keep", DELAY_MS), _delayed(clock, "d", b"drop", DELAY_MS)]
        )
        await broker.recall("d", drop.recall_handle)
    async with running_broker(config, clock) as broker:
        assert await _bodies(broker, "d", DELAY_MS + 10_000) == [b"keep"]
        await anyio.sleep(0.3)
        assert await _bodies(broker, "d", 300) == []
        assert broker.timer.pending == 0


async def test_forged_foreign_and_misdirected_handles_are_refused(tmp_path, clock) -> None:
    async with (
        running_broker(fast_broker_config(tmp_path / "a", "broker-a"), clock) as broker,
        running_broker(fast_broker_config(tmp_path / "b", "broker-b"), clock) as other,
    ):
        await broker.create_topic("d", 1, "MIXED")
        await other.create_topic("d", 1, "MIXED")
        (mine,) = await broker.send([_delayed(clock, "d", b"x", 60_000)])
        (theirs,) = await other.send([_delayed(clock, "d", b"y", 60_000)])
        handle = mine.recall_handle
        prefix, sealed = handle.rsplit(".", 1)
        flipped = sealed[:-2] + ("A" if sealed[-2] != "A" else "B") + sealed[-1]
        bad = [
            f"{prefix}.{flipped}",  # altered
            theirs.recall_handle,  # another broker's (its own keys)
            handle.replace("r1.", "2.", 1),  # not a recall handle
            "r1.YnJva2VyLWE.k1.AAAA",  # made up
            "",
            "garbage",
        ]
        for text in bad:
            err = await _refused(broker.recall("d", text), Code.BAD_REQUEST)
            assert "recall handle" in err.message
        await broker.create_topic("e", 1, "MIXED")
        await _refused(broker.recall("e", handle), Code.BAD_REQUEST)  # another topic's
        # A receipt handle is no recall handle.
        (plain,) = await broker.send([Message("e", b"now")])
        popped = await broker.pop(PopRequest("g", "e", invisible_time_ms=60_000))
        await _refused(broker.recall("e", popped.messages[0].receipt_handle), Code.BAD_REQUEST)
        assert plain.recall_handle == ""
        assert await broker.recall("d", handle) == mine.message_id  # the real one still works


async def test_a_replayed_recall_is_logged_once(tmp_path, clock, caplog) -> None:
    """A sender replaying one handle gets the same answer each time; the log and the metric
    count the message once (a replay loop must not fill the broker's log)."""
    async with running_broker(fast_broker_config(tmp_path), clock) as broker:
        await broker.create_topic("d", 1, "DELAY")
        (sent,) = await broker.send([_delayed(clock, "d", b"x", 60_000)])
        with caplog.at_level("INFO", logger="popmq.broker.core"):
            for _ in range(50):
                assert await broker.recall("d", sent.recall_handle) == sent.message_id
        lines = [r for r in caplog.records if "recalled delay message" in r.getMessage()]
        assert len(lines) == 1
