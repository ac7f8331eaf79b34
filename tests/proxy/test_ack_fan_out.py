"""Acks whose handles name several brokers: one concurrent call per broker, in an AnyIO task
group (popmq.lifecycle.fan_out), answered in the entries' order."""

from __future__ import annotations

import base64

import pytest
from popmq.broker.contract.errors import BrokerUnavailableError, Code
from popmq.broker.contract.types import AckEntry, AckEntryResult
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.core.handles import Handles
from proxy_support import NoRenewals

from popmq.config import ProxyConfig


class Port:
    """A broker that acks, refuses (a PopmqError: its entries answer with the code) or breaks."""

    def __init__(self, name: str, fails: BaseException | None = None) -> None:
        self.name = name
        self.fails = fails
        self.acked: list[str] = []

    async def ack(self, group: str, topic: str, entries: list[AckEntry]) -> list[AckEntryResult]:
        if self.fails is not None:
            raise self.fails
        self.acked += [e.receipt_handle for e in entries]
        return [AckEntryResult(e.receipt_handle, e.message_id, Code.OK) for e in entries]

    async def aclose(self) -> None:
        pass


def _handle(broker: str, key: str) -> str:
    return f"2.{base64.urlsafe_b64encode(broker.encode()).decode().rstrip('=')}.{key}.sealed"


def _handles(*ports: Port) -> Handles:
    cluster = BrokerCluster(list(ports))  # type: ignore[arg-type]
    return Handles(ProxyConfig(), cluster, NoRenewals())  # type: ignore[arg-type]


async def test_entries_of_several_brokers_are_answered_in_their_order() -> None:
    up, down = Port("ba"), Port("bb", fails=BrokerUnavailableError("bb", "request link lost"))
    entries = [AckEntry(_handle(b, f"k{i}"), f"m{i}") for i, b in enumerate(["ba", "bb", "ba"])]
    results = await _handles(up, down).ack("g", "T", entries)
    assert [r.message_id for r in results] == ["m0", "m1", "m2"]
    assert [r.code == Code.OK for r in results] == [True, False, True]
    assert up.acked == [entries[0].receipt_handle, entries[2].receipt_handle]


async def test_a_broken_broker_call_is_raised_as_itself_not_as_a_group() -> None:
    """The edge maps errors it knows; an ExceptionGroup (asyncio.TaskGroup's) it would not."""
    broken = Port("bb", fails=RuntimeError("decoder bug"))
    entries = [AckEntry(_handle("ba", "k0"), "m0"), AckEntry(_handle("bb", "k1"), "m1")]
    with pytest.raises(RuntimeError, match="decoder bug"):
        await _handles(Port("ba"), broken).ack("g", "T", entries)
