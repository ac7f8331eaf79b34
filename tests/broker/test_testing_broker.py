"""popmq.broker.testing: the real, fast broker that tests and tools start in one line."""

from __future__ import annotations

from pathlib import Path

from popmq.broker.contract.types import Message, PopRequest
from popmq.broker.testing import fast_broker_config, local_broker


async def test_a_throwaway_broker_serves_and_leaves_nothing_behind() -> None:
    async with local_broker(name="b1") as port:
        data_dir = port.broker.store.data_dir
        assert port.name == "b1" and data_dir.is_dir()
        await port.create_topic("t", 1)
        await port.send([Message("t", b"hello")])
        popped = await port.pop(PopRequest("g", "t", invisible_time_ms=1_000))
        assert [p.message.body for p in popped.messages] == [b"hello"]
    assert not data_dir.exists()


async def test_a_given_config_keeps_its_data(tmp_path: Path) -> None:
    config = fast_broker_config(tmp_path / "b2", "b2")
    async with local_broker(config) as port:
        await port.create_topic("t", 1)
        await port.send([Message("t", b"kept")])
    async with local_broker(config) as port:  # reopened: the message is still there
        popped = await port.pop(PopRequest("g", "t", invisible_time_ms=1_000))
        assert [p.message.body for p in popped.messages] == [b"kept"]
