"""Auto-creation of topics and groups is bounded in total and switchable off, refusals
answer the not-found code with the reason and are counted (issue 9, defect 7)."""

from __future__ import annotations

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message, PopRequest
from popmq.broker.testing import fast_broker_config, running_broker


def refused(broker, kind: str, reason: str) -> float:
    value = broker.metrics.registry.get_sample_value(
        "popmq_broker_auto_create_refused_total",
        {"broker": broker.name, "kind": kind, "reason": reason},
    )
    return value or 0.0


async def test_topic_auto_creation_stops_at_the_total(tmp_path) -> None:
    config = fast_broker_config(tmp_path)
    config.topics.max_auto_created = 3
    async with running_broker(config) as broker:
        for name in ("t1", "t2"):
            await broker.get_topic(name, auto_create=True)
        await broker.send([Message("t3", b"x")])
        with pytest.raises(RefusedError) as err:
            await broker.get_topic("t4", auto_create=True)
        assert err.value.code == Code.TOPIC_NOT_FOUND
        assert "max_auto_created" in err.value.message
        with pytest.raises(RefusedError) as err:
            await broker.send([Message("t5", b"x")])
        assert err.value.code == Code.TOPIC_NOT_FOUND
        assert refused(broker, "topic", "total") == 2
        # Retry topics of the groups do not count, existing topics still work.
        await broker.send([Message("t1", b"x")])
        await broker.create_topic("explicit", 2)  # an operator's create is not limited


async def test_group_auto_creation_can_be_switched_off(tmp_path) -> None:
    config = fast_broker_config(tmp_path)
    config.groups.auto_create = False
    async with running_broker(config) as broker:
        await broker.send([Message("t", b"x")])
        with pytest.raises(RefusedError) as err:
            await broker.pop(PopRequest("unknown", "t", invisible_time_ms=1000))
        assert err.value.code == Code.CONSUMER_GROUP_NOT_FOUND
        with pytest.raises(RefusedError):
            await broker.get_group("unknown")
        assert refused(broker, "group", "disabled") == 2
