"""Topic message types: a send whose type does not fit its topic is refused, as RocketMQ 5's
proxy refuses it (MESSAGE_PROPERTY_CONFLICT_WITH_TYPE); the type is durable."""

import json
import logging
import time

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message
from popmq.broker.store.framing import FramedLog
from popmq.broker.store.topics import LOG_NAME, TOPICS_RESYNC, TopicTable
from popmq.broker.testing import fast_broker_config, running_broker


def _normal(topic: str) -> Message:
    return Message(topic, b"n")


def _fifo(topic: str) -> Message:
    return Message(topic, b"f", message_group="g1")


def _delay(topic: str) -> Message:
    return Message(topic, b"d", delivery_timestamp_ms=int(time.time() * 1000) + 60_000)


async def _refused(broker, message: Message) -> RefusedError:
    with pytest.raises(RefusedError) as err:
        await broker.send([message])
    assert err.value.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, err.value
    return err.value


async def test_each_type_takes_only_its_messages(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        makers = {"NORMAL": _normal, "FIFO": _fifo, "DELAY": _delay}
        for kind in makers:
            info = await broker.create_topic(f"t-{kind}", 2, kind)
            assert info.message_type == kind
        for kind, make in makers.items():
            for topic_kind in makers:
                if topic_kind == kind:
                    assert await broker.send([make(f"t-{topic_kind}")])
                else:
                    err = await _refused(broker, make(f"t-{topic_kind}"))
                    assert topic_kind in err.message and kind in err.message
        await broker.create_topic("mixed", 2, "MIXED")
        for make in makers.values():
            assert await broker.send([make("mixed")])
        with pytest.raises(RefusedError) as err:
            await broker.create_topic("bad", 2, "SOMETIMES")
        assert err.value.code == Code.BAD_REQUEST


async def test_auto_created_topics_take_their_first_message_type_durably(tmp_path) -> None:
    config = fast_broker_config(tmp_path)
    async with running_broker(config) as broker:
        await broker.send([_fifo("by-send")])
        assert (await broker.get_topic("by-send")).message_type == "FIFO"
        await _refused(broker, _normal("by-send"))
        # A route lookup creates a topic before any message: the first one settles it.
        routed = await broker.get_topic("by-route", auto_create=True)
        assert routed.message_type == "UNSPECIFIED"
        await broker.send([_delay("by-route")])
        await _refused(broker, _fifo("by-route"))
        # An operator may change a topic's type (mqadmin updateTopic).
        await broker.create_topic("by-send", 4, "NORMAL")
        assert await broker.send([_normal("by-send")])
    async with running_broker(config) as broker:  # restarted: the types stayed
        assert (await broker.get_topic("by-send")).message_type == "NORMAL"
        assert (await broker.get_topic("by-route")).message_type == "DELAY"
        await _refused(broker, _fifo("by-route"))


async def test_operator_may_make_auto_created_topics_mixed(tmp_path) -> None:
    config = fast_broker_config(tmp_path)
    config.topics.auto_create_message_type = "MIXED"
    async with running_broker(config) as broker:
        await broker.send([_fifo("any")])
        await broker.send([_normal("any"), _delay("any")])
        assert (await broker.get_topic("any")).message_type == "MIXED"


async def test_topics_from_before_message_types_upgrade_to_mixed(tmp_path, caplog) -> None:
    config = fast_broker_config(tmp_path)
    async with running_broker(config) as broker:
        await broker.create_topic("old", 2, "FIFO")
    # Rewrite topics.log as a broker from before message types wrote it: no type field.
    path = config.data_dir / LOG_NAME
    old = FramedLog(path.with_suffix(".old"), TOPICS_RESYNC)
    old.append(json.dumps({"name": "old", "queue_count": 2, "since": 0}).encode())
    old.close()
    path.with_suffix(".old").replace(path)
    with caplog.at_level(logging.WARNING, logger="popmq.broker.store.topics"):
        async with running_broker(config) as broker:
            assert (await broker.get_topic("old")).message_type == "MIXED"
            await broker.send([_fifo("old"), _normal("old")])
    upgraded = [r for r in caplog.records if "now MIXED" in r.getMessage()]
    assert len(upgraded) == 1 and "old" in upgraded[0].getMessage()
    table = TopicTable(config.data_dir)
    table.load()
    assert not table.untyped and table.topics["old"].message_type == "MIXED"
    table.close()
