"""Prometheus metrics of a node of a replicated group, served at its --metrics-port.

One set, ``popmq_ha_*`` with labels ``group`` (the broker name every node of a group shares)
and ``node``, whoever decides the role:

- the role: ``popmq_ha_epoch``, ``popmq_ha_is_leader``, ``popmq_ha_has_leader``,
  ``popmq_ha_in_sync_size``; from the election (popmq.broker.leader_gate.GroupCollector, with
  ``popmq_ha_elections_won_total``) when etcd decides it, else from the static role here;
- replication, as the leader sees it: ``popmq_ha_replication_lag_bytes`` and
  ``popmq_ha_replication_lag_seconds`` per ``follower``;
- the last promotion: ``popmq_ha_promotion_seconds`` (opening the store) and the commitlog
  records and bytes its recovery walked (``popmq_ha_promotion_scanned_records|bytes``).

The broker's own metrics come from whichever broker the node runs now (a follower runs none).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from popmq.broker.core import Broker
from popmq.broker.replication.leader import ReplicationLeader
from popmq.broker.replication.role import GroupRole
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from popmq.broker.replication.node import Promotion

LABELS = ["group", "node"]


class NodeCollector(Collector):
    def __init__(
        self,
        group: str,
        node: Callable[[], str],
        role: Callable[[], GroupRole | None],
        broker: Callable[[], Broker | None],
        leader: Callable[[], ReplicationLeader | None],
        *,
        role_gauges: bool = True,
        promotion: Callable[[], Promotion | None] = lambda: None,
    ) -> None:
        self._group, self._node, self._role = group, node, role
        self._broker, self._leader = broker, leader
        self._role_gauges = role_gauges  # False: the election's collector exports them
        self._promotion = promotion

    def collect(self) -> Iterator[Metric]:
        broker = self._broker()
        if broker is not None:
            yield from broker.metrics.registry.collect()
        leader = self._leader()
        if self._role_gauges:
            yield from self._role_families(leader)
        lag_bytes = GaugeMetricFamily(
            "popmq_ha_replication_lag_bytes",
            "Commitlog bytes a follower has not acknowledged yet (on the leader)",
            labels=["group", "follower"],
        )
        lag_s = GaugeMetricFamily(
            "popmq_ha_replication_lag_seconds",
            "Seconds since a follower last caught up (on the leader)",
            labels=["group", "follower"],
        )
        if leader is not None:
            for follower in leader.status():
                name = [self._group, follower.name]
                lag_bytes.add_metric(name, float(follower.lag_bytes))
                if follower.lag_s is not None:
                    lag_s.add_metric(name, follower.lag_s)
        yield lag_bytes
        yield lag_s
        yield from self._promotion_families()

    def _promotion_families(self) -> Iterator[Metric]:
        promotion = self._promotion()
        families = {
            "popmq_ha_promotion_seconds": "seconds this node took to open its store when it "
            "last began to lead",
            "popmq_ha_promotion_scanned_records": "commitlog records its recovery walked then "
            "(a follower's indexes cover the rest)",
            "popmq_ha_promotion_scanned_bytes": "commitlog bytes its recovery walked then",
        }
        values = {}
        if promotion is not None:
            values = {
                "popmq_ha_promotion_seconds": promotion.seconds,
                "popmq_ha_promotion_scanned_records": float(promotion.records_scanned),
                "popmq_ha_promotion_scanned_bytes": float(promotion.bytes_scanned),
            }
        labels = [self._group, self._node()]
        for name, text in families.items():
            gauge = GaugeMetricFamily(name, text, labels=LABELS)
            if name in values:
                gauge.add_metric(labels, values[name])
            yield gauge

    def _role_families(self, leader: ReplicationLeader | None) -> Iterator[Metric]:
        labels = [self._group, self._node()]
        role = self._role()
        families = {
            "popmq_ha_epoch": "the group's epoch as this node sees it (0: no leader)",
            "popmq_ha_is_leader": "1 while this node leads its group",
            "popmq_ha_has_leader": "1 while this node knows a leader of its group",
            "popmq_ha_in_sync_size": "nodes in the group's in-sync set",
        }
        values: dict[str, float] = {}
        if role is not None:
            values = {
                "popmq_ha_epoch": float(role.epoch),
                "popmq_ha_is_leader": 1.0 if role.is_leader else 0.0,
                "popmq_ha_has_leader": 1.0 if role.is_leader or role.leader_address else 0.0,
            }
        if leader is not None:  # a follower does not know the set: the leader exports it
            values["popmq_ha_in_sync_size"] = float(leader.in_sync.size)
        for name, text in families.items():
            gauge = GaugeMetricFamily(name, text, labels=LABELS)
            if name in values:
                gauge.add_metric(labels, values[name])
            yield gauge


def node_registry(collector: NodeCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry
