"""ProxyServices: what every activity needs, built once per proxy."""

from __future__ import annotations

from dataclasses import dataclass, field

from popmq.config import PopmqConfig, ProxyConfig
from proxy.cluster import BrokerCluster
from proxy.longpoll.base import LongPollStrategy
from proxy.metrics import ProxyMetrics
from proxy.registry import ClientRegistry
from proxy.tasks import BackgroundTasks


@dataclass(slots=True)
class ProxyServices:
    config: PopmqConfig
    cluster: BrokerCluster
    strategy: LongPollStrategy
    metrics: ProxyMetrics
    registry: ClientRegistry = field(default_factory=ClientRegistry)
    tasks: BackgroundTasks = field(default_factory=BackgroundTasks)
    # The address clients reach this proxy at (set once the server is bound).
    advertised_host: str = "127.0.0.1"
    advertised_port: int = 0

    @property
    def proxy(self) -> ProxyConfig:
        return self.config.proxy
