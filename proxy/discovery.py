"""Following broker groups in etcd (``popmq proxy --etcd URL``): no broker list.

``follow_groups`` reads every group under the prefix, then watches it. Each change re-reads
the groups (a handful of keys) and applies them to the BrokerCluster:

- a group with a leader is routed to the leader's address (a new group within the watch's
  latency of its first election; a new leader replaces the port, so sends, receives, acks,
  notify watches and the request link all move with it; the old port is closed after
  ``CLOSE_GRACE_S``);
- a group that had a leader and lost it gets a ``LeaderlessPort``: every call fails at once
  with HA_NOT_AVAILABLE (retryable), and its queues stay in routes, so a FIFO message group
  waits for its queue instead of moving to another one;
- ``drain`` marks stop new sends; a group whose keys are all gone (``admin brokers remove``)
  leaves the cluster.

If etcd cannot be reached the proxy keeps its last view (brokers keep serving; leaders cannot
change without etcd anyway) and keeps trying; it also re-reads every ``RESYNC_S`` in case a
watch stalls without an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn

import anyio
from popmq.broker.contract.errors import BrokerUnavailableError, Code
from popmq.broker.contract.port import BrokerPort
from popmq.proxy.cluster import BrokerCluster

from popmq.coord.directory import GroupView, read_groups
from popmq.coord.keys import groups_prefix
from popmq.coord.store import CoordStore, CoordUnavailableError
from popmq.lifecycle import AsyncClosing

log = logging.getLogger("popmq.proxy.discovery")

CLOSE_GRACE_S = 5.0
RESYNC_S = 10.0
RETRY_S = 1.0


class NoLeaderError(BrokerUnavailableError):
    """The broker group has no leader now (an election is due, or no in-sync node is alive)."""

    code = Code.HA_NOT_AVAILABLE


class LeaderlessPort(AsyncClosing):
    """Stands for a group without a leader: every call fails at once with HA_NOT_AVAILABLE."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def _refuse(self, *_args: Any, **_kwargs: Any) -> NoReturn:
        raise NoLeaderError(self._name, f"broker group {self._name} has no leader now")

    async def _call(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    send = pop = ack = recall = change_invisible_time = hand_back = notify = forward_to_dlq = _call
    pull = _call
    end_transaction = claim_transaction_checks = list_transactions = _call
    get_consumer_offset = update_consumer_offset = offset_for_timestamp = _call
    create_topic = get_topic = list_topics = delete_topic = _call
    get_group = update_group = list_groups = delete_group = group_stats = _call

    async def aclose(self) -> None:
        pass


class GroupFollower:
    """Applies the groups read from etcd to a BrokerCluster (see the module's doc)."""

    def __init__(
        self,
        cluster: BrokerCluster,
        make_port: Callable[[str, str], BrokerPort],
        on_change: Callable[[], None] = lambda: None,
        on_leader: Callable[[str, bool | None], None] = lambda group, up: None,
    ) -> None:
        self.cluster = cluster
        self._make_port = make_port  # (group, address) -> a port to that node
        self._on_change = on_change
        # (group, has a leader; None: gone): popmq_proxy_broker_up for followed groups.
        self._on_leader = on_leader
        self._addresses: dict[str, str] = {}  # group -> leader address routed to ("" none)
        self._retired: list[tuple[float, BrokerPort]] = []

    def apply(self, groups: dict[str, GroupView]) -> None:
        self.cluster.group_views = dict(groups)
        changed = False
        for name, view in groups.items():
            self.cluster.set_draining(name, view.draining)
            address = view.leader.address if view.leader else ""
            if self._addresses.get(name) == address:
                continue
            if view.leader is not None:
                port = self._make_port(name, address)
                log.info("group %s: leader %s at %s (epoch %d)", name, view.leader.name,
                         address, view.leader.epoch)  # fmt: skip
            elif name in self._addresses:
                port = LeaderlessPort(name)
                log.warning("group %s has no leader", name)
            else:
                continue  # never led yet: not routable
            self._retire(self.cluster.put_port(port))
            self._addresses[name] = address
            self._on_leader(name, view.leader is not None)
            changed = True
        for name in [n for n in self._addresses if n not in groups]:
            log.info("group %s is gone from etcd: removed", name)
            self._retire(self.cluster.remove_port(name))
            del self._addresses[name]
            self._on_leader(name, None)
            changed = True
        if changed:
            self._on_change()

    def _retire(self, port: BrokerPort | None) -> None:
        if port is not None:
            self._retired.append((anyio.current_time() + CLOSE_GRACE_S, port))

    async def close_retired(self, *, all_now: bool = False) -> None:
        now = anyio.current_time()
        due = [p for at, p in self._retired if all_now or at <= now]
        self._retired = [(at, p) for at, p in self._retired if not (all_now or at <= now)]
        for port in due:
            try:
                await port.aclose()
            except Exception:  # a broken old link must not stop the follower
                log.exception("closing the old port of %s failed", port.name)

    async def sync(self, store: CoordStore, prefix: str) -> int:
        """Read and apply every group once; the revision read at."""
        kvs, revision = await store.get_prefix(groups_prefix(prefix))
        self.apply(read_groups(prefix, kvs))
        return revision

    async def follow(self, store: CoordStore, prefix: str) -> None:
        """Follow the groups until cancelled."""
        unreachable = False
        while True:
            try:
                revision = await self.sync(store, prefix)
                if unreachable:
                    log.info("etcd reachable again; following groups")
                    unreachable = False
                with anyio.move_on_after(RESYNC_S):
                    async for _event in store.watch_prefix(groups_prefix(prefix), revision + 1):
                        await self.sync(store, prefix)
                        await self.close_retired()
                await self.close_retired()
            except CoordUnavailableError as exc:
                if not unreachable:
                    log.warning("etcd unreachable; keeping the last view of groups: %s",
                                exc.message)  # fmt: skip
                    unreachable = True
                await anyio.sleep(RETRY_S)
