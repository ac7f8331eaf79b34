"""ProxyServices: what every activity needs, built once per proxy."""

from __future__ import annotations

from dataclasses import dataclass, field

from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.longpoll.base import LongPollStrategy
from popmq.proxy.metrics import ProxyMetrics
from popmq.proxy.registry import ClientRegistry
from popmq.proxy.renewal import HandleRenewer
from popmq.proxy.tasks import BackgroundTasks

from popmq.config import PopmqConfig, ProxyConfig


@dataclass(slots=True)
class ProxyServices:
    config: PopmqConfig
    cluster: BrokerCluster
    strategy: LongPollStrategy
    metrics: ProxyMetrics
    registry: ClientRegistry = field(default_factory=ClientRegistry)
    tasks: BackgroundTasks = field(default_factory=BackgroundTasks)
    renewer: HandleRenewer = field(default_factory=HandleRenewer)
    # The address clients reach this proxy at (set once the server is bound).
    advertised_host: str = "127.0.0.1"
    advertised_port: int = 0

    @property
    def proxy(self) -> ProxyConfig:
        return self.config.proxy
