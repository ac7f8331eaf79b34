"""A promoted follower walks only the commitlog it had not indexed yet (issue 19).

The follower indexes what it applies (broker/replication/indexer.py); before, its store had
to walk the whole commitlog at promotion, which made every failover slower as the log grew.
Two ReplicatedNodes in this process on 127.0.0.1: the follower indexes N records, M more
arrive, it is promoted, and it must walk at most those M, then serve every message once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from popmq.broker.contract.types import Message, PopRequest
from popmq.broker.replication.files import list_segments, log_end
from popmq.broker.replication.node import ReplicatedNode
from popmq.broker.replication.role import GroupRole, StaticRoleSource
from prometheus_client import generate_latest

from popmq.config import BrokerConfig, ReplicationConfig, StoreConfig

pytestmark = pytest.mark.wallclock

INDEXED = 400  # records the follower has indexed before the promotion
TAIL = 12  # records sent after: only these may be walked


def config(root: Path, node: str) -> BrokerConfig:
    return BrokerConfig(
        name="broker-p", port=0, data_dir=root / node,
        store=StoreConfig(flush="async", segment_bytes=64 * 1024),
        replication=ReplicationConfig(mode="sync", min_in_sync=2, node=node),
    )  # fmt: skip


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        await anyio.sleep(0.05)


async def test_a_promoted_follower_walks_only_the_tail_and_serves_every_message(
    tmp_path: Path,
) -> None:
    roles_a = StaticRoleSource(GroupRole(1, "broker-p", "", is_leader=True))
    a = ReplicatedNode(config(tmp_path, "p0"), roles_a)
    await a.start()
    roles_b = StaticRoleSource(
        GroupRole(1, "broker-p", f"127.0.0.1:{a.bound_port}", is_leader=False)
    )
    b = ReplicatedNode(config(tmp_path, "p1"), roles_b)
    await b.start()
    address_b = f"127.0.0.1:{b.bound_port}"
    sent: list[bytes] = []
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(a.run)
            group.start_soon(b.run)
            await eventually(lambda: a.leader is not None and a.leader.in_sync.size == 2,
                             "p1 never came in sync")  # fmt: skip
            await a.port.create_topic("T", 2)
            pad = b"x" * 200
            for start in range(0, INDEXED, 50):
                bodies = [b"%d-" % i + pad for i in range(start, start + 50)]
                await a.port.send([Message(topic="T", body=body) for body in bodies])
                sent += bodies
            await a.port.create_topic("U", 1)  # a topic the indexer learns on the way
            await a.port.send([Message(topic="U", body=b"u-0")])
            end = log_end(list_segments(tmp_path / "p0"))

            def indexed() -> bool:
                follower = b.follower
                return follower is not None and follower.writer.indexer.position >= end

            await eventually(indexed, "the follower never indexed what it applied")
            assert b.follower is not None
            indexer = b.follower.writer.indexer
            assert not indexer.stopped and indexer.records_indexed >= INDEXED + 1
            tail = [b"tail-%d" % i for i in range(TAIL)]
            for body in tail:  # one by one: each is replicated (sync) before the next
                await a.port.send([Message(topic="T", body=body)])
            sent += tail

            # promotion: p1 leads epoch 2, p0 follows it
            await roles_a.set(GroupRole(2, "broker-p", address_b, is_leader=False))
            await roles_b.set(GroupRole(2, "broker-p", address_b, is_leader=True))
            await eventually(lambda: b.port.leading is not None, "p1 never led")
            promotion = b.promotion
            assert promotion is not None
            assert promotion.records_scanned <= TAIL, promotion
            assert promotion.bytes_scanned < 64 * 1024, promotion
            page = generate_latest(b.metrics_registry()).decode()
            assert (
                f'popmq_ha_promotion_scanned_records{{group="broker-p",node="p1"}} '
                f"{float(promotion.records_scanned)}" in page
            )

            await eventually(lambda: b.leader is not None and b.leader.in_sync.size == 2,
                             "p0 never followed p1")  # fmt: skip
            received: list[bytes] = []
            for _ in range(200):
                popped = await b.port.pop(PopRequest("G", "T", max_messages=32))
                if not popped.messages:
                    break
                received += [m.message.body for m in popped.messages]
            assert len(received) == len(set(received)), "a message was served twice"
            assert sorted(received) == sorted(sent), "a message was lost"
            popped_u = await b.port.pop(PopRequest("G", "U", max_messages=32))
            assert [m.message.body for m in popped_u.messages] == [b"u-0"]
            group.cancel_scope.cancel()
    finally:
        await a.aclose()
        await b.aclose()
