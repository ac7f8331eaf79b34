"""Prometheus metrics of a node of a replicated group, served at its --metrics-port.

The broker's own metrics come from whichever broker the node runs now (a follower runs none),
plus ``popmq_broker_replication_*``: the role and epoch, the in-sync set's size, and each
follower's lag as the leader sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from popmq.broker.core import Broker
from popmq.broker.replication.leader import ReplicationLeader
from popmq.broker.replication.role import GroupRole
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class NodeCollector(Collector):
    def __init__(
        self,
        broker_name: str,
        node: Callable[[], str],
        role: Callable[[], GroupRole | None],
        broker: Callable[[], Broker | None],
        leader: Callable[[], ReplicationLeader | None],
    ) -> None:
        self._name, self._node, self._role = broker_name, node, role
        self._broker, self._leader = broker, leader

    def collect(self) -> Iterator[Metric]:
        broker = self._broker()
        if broker is not None:
            yield from broker.metrics.registry.collect()
        labels = [self._name, self._node()]
        role = self._role()
        leading = GaugeMetricFamily(
            "popmq_broker_replication_leader",
            "1 while this node leads its broker group, 0 while it follows",
            labels=["broker", "node"],
        )
        epoch = GaugeMetricFamily(
            "popmq_broker_replication_epoch",
            "The epoch of this node's role",
            labels=["broker", "node"],
        )
        if role is not None:
            leading.add_metric(labels, 1.0 if role.is_leader else 0.0)
            epoch.add_metric(labels, float(role.epoch))
        yield leading
        yield epoch
        leader = self._leader()
        in_sync = GaugeMetricFamily(
            "popmq_broker_replication_in_sync_nodes",
            "Nodes in the in-sync set, the leader counted (leaders only)",
            labels=["broker", "node"],
        )
        lag_bytes = GaugeMetricFamily(
            "popmq_broker_replication_lag_bytes",
            "Commitlog bytes a follower has not acknowledged yet (leaders only)",
            labels=["broker", "follower"],
        )
        lag_s = GaugeMetricFamily(
            "popmq_broker_replication_lag_seconds",
            "Seconds since a follower last caught up (leaders only)",
            labels=["broker", "follower"],
        )
        if leader is not None:
            in_sync.add_metric(labels, float(leader.in_sync.size))
            for follower in leader.status():
                name = [self._name, follower.name]
                lag_bytes.add_metric(name, float(follower.lag_bytes))
                if follower.lag_s is not None:
                    lag_s.add_metric(name, follower.lag_s)
        yield in_sync
        yield lag_bytes
        yield lag_s


def node_registry(collector: NodeCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry
