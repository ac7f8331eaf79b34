"""A follower that fails outside its stream's own retries (its data directory cannot be
opened, say) refuses calls and tries again by itself. It used to refuse every call until its
role changed, never catching up: the group ran one copy short until someone restarted it.

In process, no server, no etcd."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest
from popmq.broker.replication import node as node_module
from popmq.broker.replication.follower import ReplicaFollower
from popmq.broker.replication.indexer import ReplicaIndexer
from popmq.broker.replication.node import ReplicatedNode
from popmq.broker.replication.replica import ReplicaWriter
from popmq.broker.replication.role import GroupRole, StaticRoleSource

from popmq.config import BrokerConfig, ReplicationConfig, StoreConfig

FOLLOWER = GroupRole(7, "broker-a", "127.0.0.1:1", is_leader=False)


def config(root: Path) -> BrokerConfig:
    return BrokerConfig(
        name="broker-s", port=0, data_dir=root / "s1", store=StoreConfig(flush="async"),
        replication=ReplicationConfig(mode="sync", min_in_sync=2, node="s1"),
    )  # fmt: skip


async def test_a_follower_that_could_not_open_its_directory_tries_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    opens = 0
    opened_again = anyio.Event()
    real_open = ReplicaWriter.open

    def flaky_open(self: ReplicaWriter) -> None:
        nonlocal opens
        opens += 1
        if opens <= 2:
            raise OSError("disk gone")
        opened_again.set()
        real_open(self)

    monkeypatch.setattr(ReplicaWriter, "open", flaky_open)
    monkeypatch.setattr(node_module, "FOLLOW_RETRY_S", 0.05)
    node = ReplicatedNode(config(tmp_path), StaticRoleSource(FOLLOWER))
    caplog.set_level(logging.DEBUG, logger=node_module.__name__)
    async with anyio.create_task_group() as group:
        group.start_soon(node.run)
        with anyio.fail_after(20):  # a failure bound only: retries come every 0.05 s
            while opens < 1:  # noqa: ASYNC110 (no event)
                await anyio.sleep(0.01)
            assert node.port.refusal is not None and "cannot follow" in node.port.refusal
            await opened_again.wait()
        group.cancel_scope.cancel()
    assert opens == 3
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "disk gone" in errors[0].getMessage()  # once a stretch


async def test_a_follower_whose_open_failed_after_taking_the_lock_tries_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory's lock is taken first in ReplicaWriter.open: a failure after it (a full
    disk as the indexer writes its checkpoint) must give it back, or every retry is refused
    "used by another store" (the failed open's descriptor still holds the flock) and the
    follower never follows, even once the disk has room again. Review of wave 10."""
    resumes = 0
    real_resume = ReplicaIndexer.resume

    def flaky_resume(self: ReplicaIndexer) -> None:
        nonlocal resumes
        resumes += 1
        if resumes <= 2:
            raise OSError(28, "No space left on device")
        real_resume(self)

    monkeypatch.setattr(ReplicaIndexer, "resume", flaky_resume)
    monkeypatch.setattr(node_module, "FOLLOW_RETRY_S", 0.05)
    node = ReplicatedNode(config(tmp_path), StaticRoleSource(FOLLOWER))
    refusals: set[str] = set()
    async with anyio.create_task_group() as group:
        group.start_soon(node.run)
        with anyio.fail_after(20):  # a failure bound only: retries come every 0.05 s
            while resumes < 3 and node.follower is None:
                refusals.add(node.port.refusal or "")
                if any("used by another store" in r for r in refusals):
                    break
                await anyio.sleep(0.01)
        group.cancel_scope.cancel()
    assert not [r for r in refusals if "used by another store" in r]
    assert resumes == 3


async def test_a_failure_after_following_again_is_an_error_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """ERROR once a stretch of failures: a follower that followed (applied batches) since its
    last failure starts a new stretch, logged at ERROR again, not at DEBUG as a retry of the
    first (an outage hours later went unseen). Review of wave 10."""
    attempts = 0
    settled = anyio.Event()

    async def run(self: ReplicaFollower) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 2:
            self.batches = 3  # followed for a while, then failed
        if attempts <= 3:
            raise ValueError(f"failure {attempts}")
        settled.set()
        await anyio.sleep_forever()

    monkeypatch.setattr(ReplicaFollower, "run", run)
    monkeypatch.setattr(node_module, "FOLLOW_RETRY_S", 0.01)
    node = ReplicatedNode(config(tmp_path), StaticRoleSource(FOLLOWER))
    caplog.set_level(logging.DEBUG, logger=node_module.__name__)
    async with anyio.create_task_group() as group:
        group.start_soon(node.run)
        with anyio.fail_after(20):  # a failure bound only: retries come every 0.01 s
            await settled.wait()
        group.cancel_scope.cancel()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2
    assert "failure 1" in errors[0] and "failure 2" in errors[1]  # failure 3: a retry's DEBUG
