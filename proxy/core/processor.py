"""ProxyCore: every operation of the proxy, domain in and domain out (RocketMQ's
MessagingProcessor). Edges (the gRPC servicers, and any other) hold one and call its parts.

Each part gets what it needs through its constructor; ProxyCore only builds them from the
proxy's services (cluster, long-poll strategy, registry, admission, renewer, metrics).
"""

from __future__ import annotations

from collections.abc import Callable

from popmq.proxy.admission import LongPollAdmission
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.core.address import ProxyAddress
from popmq.proxy.core.admin import Admin, ReadBounds
from popmq.proxy.core.clients import Clients
from popmq.proxy.core.handles import Handles
from popmq.proxy.core.offsets import Offsets
from popmq.proxy.core.receive import Receiver
from popmq.proxy.core.routes import Routes
from popmq.proxy.core.send import Sender
from popmq.proxy.core.transactions import ProducerChannels, Transactions
from popmq.proxy.events import ProxyEvents
from popmq.proxy.longpoll.base import LongPollStrategy
from popmq.proxy.registry import ClientRegistry
from popmq.proxy.renewal import HandleRenewer

from popmq.clock import SYSTEM, Clock
from popmq.config import PopmqConfig


class ProxyCore:
    def __init__(
        self,
        config: PopmqConfig,
        *,
        cluster: BrokerCluster,
        strategy: LongPollStrategy,
        registry: ClientRegistry,
        admission: LongPollAdmission,
        renewer: HandleRenewer,
        metrics: ProxyEvents,
        metrics_text: Callable[[], str],
        address: ProxyAddress,
        clock: Clock = SYSTEM,
    ) -> None:
        proxy = config.proxy
        self.address = address
        self.routes = Routes(cluster, registry, config.broker.pop.share_queue_num)
        self.clients = Clients(proxy, cluster, registry)
        self.sender = Sender(proxy, cluster, metrics, clock)
        self.receiver = Receiver(proxy, cluster, strategy, admission, registry, renewer, metrics)
        self.handles = Handles(proxy, cluster, renewer)
        self.offsets = Offsets(proxy, cluster)
        bounds = ReadBounds(proxy.admin_max_scan, proxy.admin_max_results, proxy.admin_scan_bytes)
        self.admin = Admin(
            cluster, registry, metrics_text, address, bounds, clock, cluster_name=proxy.cluster
        )
        self.transactions = Transactions(
            cluster, ProducerChannels(), metrics, proxy.transaction_check_poll_ms
        )
