"""ProxyServices: what every activity needs, built once per proxy."""

from __future__ import annotations

from dataclasses import dataclass, field

from popmq.proxy.admission import LongPollAdmission
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.longpoll.base import LongPollStrategy
from popmq.proxy.metrics import ProxyMetrics
from popmq.proxy.registry import ClientRegistry
from popmq.proxy.renewal import HandleRenewer

from popmq.config import PopmqConfig, ProxyConfig
from popmq.lifecycle import TaskOwner


@dataclass(slots=True)
class ProxyServices:
    config: PopmqConfig
    cluster: BrokerCluster
    strategy: LongPollStrategy
    metrics: ProxyMetrics
    registry: ClientRegistry = field(default_factory=ClientRegistry)
    # Work that outlives its request (releases, the renewal loop); drained 2 s on shutdown.
    tasks: TaskOwner = field(default_factory=lambda: TaskOwner("proxy", grace_s=2.0))
    # The address clients reach this proxy at (set once the server is bound).
    advertised_host: str = "127.0.0.1"
    advertised_port: int = 0
    admission: LongPollAdmission = field(init=False)
    renewer: HandleRenewer = field(init=False)

    def __post_init__(self) -> None:
        self.admission = LongPollAdmission(self.config.proxy, self.metrics)
        self.renewer = HandleRenewer(
            self.config.proxy, self.cluster, self.registry, self.metrics, self.tasks
        )

    @property
    def proxy(self) -> ProxyConfig:
        return self.config.proxy
