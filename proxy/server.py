"""ProxyServer: one proxy's gRPC server (MessagingService, admin, health) over a broker cluster.

    server = ProxyServer(config, ports)     # ports: BrokerPort, in-process or remote
    port = await server.start()             # bound port (config.proxy.port 0 picks one)
    ...
    await server.aclose()           # or: async with ProxyServer(config, ports) as server

The server does not own the brokers behind the ports (embedded mode closes them itself), but
it closes the ports (remote ports close their channels).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popmq.broker.contract.port import BrokerPort
from popmq.broker.wire.bodies import splitting_decoder
from popmq.broker.wire.undecodable import add_tolerant
from popmq.proxy.admission import LongPollAdmission
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.core.address import ProxyAddress
from popmq.proxy.core.processor import ProxyCore
from popmq.proxy.grpc.access import access_guard
from popmq.proxy.grpc.edge import Edge
from popmq.proxy.grpc.servicer import MessagingServicer
from popmq.proxy.health import ProxyHealth
from popmq.proxy.longpoll import make_strategy
from popmq.proxy.longpoll.base import LongPollStrategy
from popmq.proxy.metrics import ProxyMetrics
from popmq.proxy.registry import ClientRegistry
from popmq.proxy.renewal import HandleRenewer

from popmq.config import PopmqConfig
from popmq.lifecycle import TaskOwner
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.pb.rocketmq.v2 import service_pb2_grpc
from popmq.reflection import enable_reflection
from popmq.security.tls import server_credentials
from popmq.tracing import server_interceptors

log = logging.getLogger(__name__)

MESSAGING_SERVICE = "apache.rocketmq.v2.MessagingService"
ADMIN_SERVICE = "popmq.admin.v1.AdminService"
UPSTREAM_ADMIN_SERVICE = "apache.rocketmq.v2.Admin"  # rocketmq-apis' control plane
HEALTH_SERVICE = "grpc.health.v1.Health"
SERVED_SERVICES = (MESSAGING_SERVICE, ADMIN_SERVICE, UPSTREAM_ADMIN_SERVICE)
GRPC_MAX_MESSAGE_BYTES = 2**31 - 1  # INT_MAX, the largest value a channel argument holds


def grpc_options(
    max_body_bytes: int,
    max_long_polls: int = 10_000,
    reuse_port: bool = False,
    max_request_bytes: int | None = None,
    max_streams_per_connection: int = 2_000,
) -> list[tuple[str, int]]:
    # RocketMQ's proxy takes 32 maximal bodies plus 2 MiB of properties in one call (its
    # grpcMaxInboundMessageSize, 130 MiB for 4 MiB bodies): a batch send it accepts must not
    # fail here in the transport (RESOURCE_EXHAUSTED, no status of ours). An oversize body
    # reaches validation (MESSAGE_BODY_TOO_LARGE) as well.
    # gRPC's channel arguments are C ints: at 64 MiB bodies 32 of them are past one (the
    # server would not start), so the limit stops at gRPC's largest message.
    limit = min(max(32 * max_body_bytes + (2 << 20), 16 << 20), GRPC_MAX_MESSAGE_BYTES)
    if max_request_bytes is not None:  # the operator's bound (proxy.max_request_bytes)
        limit = min(max_request_bytes, GRPC_MAX_MESSAGE_BYTES)
    return [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
        # One connection cannot open streams (health watches, Telemetry) without bound.
        ("grpc.max_concurrent_streams", max_streams_per_connection),
        # Off unless workers share the port: a second proxy on a taken port must fail.
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        # Calls the transport accepted before our handler picked them up. Past this grpc-core
        # cancels new calls at random (clients see CANCELLED, no status of ours); make room
        # for every long poll admission control admits, so that it is what sheds, with
        # TOO_MANY_REQUESTS and a metric.
        ("grpc.server.max_pending_requests", max_long_polls + 1_000),
        ("grpc.server.max_pending_requests_hard_limit", 2 * (max_long_polls + 1_000)),
        # Notice clients that vanished without closing (their held receives are freed).
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def _bind(
    server: grpc.aio.Server, host: str, port: int, credentials: grpc.ServerCredentials | None
) -> int:
    address = f"{host}:{port}"
    bound = (
        server.add_insecure_port(address)
        if credentials is None
        else server.add_secure_port(address, credentials)
    )
    if bound == 0:
        raise OSError(f"cannot bind to {address}")
    return bound


class ProxyServer:
    def __init__(
        self,
        config: PopmqConfig,
        ports: Sequence[BrokerPort],
        *,
        metrics: ProxyMetrics | None = None,
        strategy: LongPollStrategy | None = None,
    ) -> None:
        # The composition root: the proxy's services, then the core over them.
        self.config = config
        self.metrics = metrics = metrics or ProxyMetrics(cluster=config.proxy.cluster)
        self.cluster = BrokerCluster(
            ports,
            auto_create_topics=config.broker.topics.auto_create,
            dynamic=bool(config.proxy.etcd.endpoints),  # groups followed in etcd
        )
        metrics.watch_links(self.cluster.ports)
        self.strategy = strategy or make_strategy(config.proxy, metrics)
        clients_refused = partial(metrics.refused, "clients_per_access_key")
        self.registry = ClientRegistry(
            max_per_access_key=config.proxy.max_clients_per_access_key, on_refused=clients_refused
        )
        # Work that outlives its request (releases, the renewal loop); drained 2 s on shutdown.
        self.tasks = TaskOwner("proxy", grace_s=2.0)
        # Loops and stream readers that end at once on shutdown (transaction checks, the
        # readers of Telemetry streams).
        self.streams = TaskOwner("proxy-streams", grace_s=0)
        self.admission = LongPollAdmission(config.proxy, metrics)
        self.renewer = HandleRenewer(config.proxy, self.cluster, self.registry, metrics, self.tasks)
        self.proxy_address = ProxyAddress(config.proxy)
        self.core = ProxyCore(
            config,
            cluster=self.cluster,
            strategy=self.strategy,
            registry=self.registry,
            admission=self.admission,
            renewer=self.renewer,
            metrics=metrics,
            metrics_text=metrics.exposition,
            address=self.proxy_address,
        )
        self._server: grpc.aio.Server | None = None
        self._admin_server: grpc.aio.Server | None = None
        self._health = ProxyHealth()
        self.port = 0
        self.admin_port: int | None = None  # bound port of the admin listener, if separate

    @property
    def address(self) -> str:
        return f"{self.proxy_address.bound.host}:{self.port}"

    async def start(self) -> int:
        proxy = self.config.proxy
        # Namespaces first (the client's names become NAMESPACE%name), then authentication and
        # permissions on those real resource names (None: open, logged as such), TLS on both ports.
        guard = access_guard(proxy, self.metrics, self.streams)
        # Tracing first (refused calls are traced too), then namespaces (the client's names
        # become NAMESPACE%name), then the access guard on those real resource names: the
        # last two in the server's one generic handler, not as interceptors (edge.py).
        edge = Edge(guard)
        credentials = server_credentials(proxy.tls.cert, proxy.tls.key, proxy.tls.client_ca)
        server = grpc.aio.server(
            options=grpc_options(
                proxy.max_body_bytes,
                proxy.max_long_polls,
                proxy.reuse_port,
                proxy.max_request_bytes,
                proxy.max_streams_per_connection,
            ),
            interceptors=server_interceptors(),
        )
        # Undecodable bodies answer INVALID_ARGUMENT (counted, logged at a bounded rate).
        add_tolerant(
            service_pb2_grpc.add_MessagingServiceServicer_to_server,
            MessagingServicer(self.core, self.metrics, proxy, self.streams),
            edge,
            self._count_refused_body,
            # A large batch's bodies stay in grpc's bytes of it (views), not copied once more.
            {"SendMessage": splitting_decoder(s.SendMessageRequest.FromString, 1, 4)},
            small_request_bytes=proxy.max_small_request_bytes,
            large_methods=frozenset({"SendMessage"}),
            registered=False,  # served through the edge (edge.py)
        )
        # Tolerant as well: an undecodable health check answers INVALID_ARGUMENT, no traceback.
        add_tolerant(
            health_pb2_grpc.add_HealthServicer_to_server, self._health, edge, registered=False
        )
        if proxy.admin_port is None:
            self._add_admin(edge)
        client_port_services = SERVED_SERVICES if proxy.admin_port is None else (MESSAGING_SERVICE,)
        enable_reflection(edge, [*client_port_services, HEALTH_SERVICE], registered=False)
        server.add_generic_rpc_handlers((edge,))
        self.port = _bind(server, proxy.host, proxy.port, credentials)
        self.proxy_address.bind(proxy.host, self.port)
        if proxy.admin_port is not None:
            # Traced like the client port (tracing first, then the access guard).
            admin = grpc.aio.server(interceptors=server_interceptors())
            admin_edge = Edge(guard.for_another_server() if guard is not None else None,
                              namespaces=False)  # fmt: skip
            self._add_admin(admin_edge)
            add_tolerant(health_pb2_grpc.add_HealthServicer_to_server, self._health, admin_edge,
                         registered=False)  # fmt: skip
            enable_reflection(
                admin_edge, [ADMIN_SERVICE, UPSTREAM_ADMIN_SERVICE, HEALTH_SERVICE],
                registered=False,
            )  # fmt: skip
            admin.add_generic_rpc_handlers((admin_edge,))
            self.admin_port = _bind(admin, proxy.host, proxy.admin_port, credentials)
            await admin.start()
            self._admin_server = admin
            log.info("admin API listening on %s:%d", proxy.host, self.admin_port)
        self.admission.start()
        self.streams.spawn(self.core.transactions.run(), "transaction-checks")
        await server.start()
        # Health per service (each one served here), plus "" for the server as a whole.
        for name in ("", *SERVED_SERVICES):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        log.info(
            "proxy listening on %s:%d (%s)",
            proxy.host,
            self.port,
            "TLS" if credentials else "plaintext",
        )
        return self.port

    def _add_admin(self, server: Edge) -> None:
        from popmq.proxy.admin.service import add_admin_service  # the admin API is optional
        from popmq.proxy.admin.upstream import add_upstream_admin_service

        small = self.config.proxy.max_small_request_bytes
        add_admin_service(server, self.core.admin, self._count_refused_body, small)
        add_upstream_admin_service(server, self.core.admin, self._count_refused_body, small)

    def _count_refused_body(self, method: str, code: str) -> None:
        """An undecodable (INVALID_ARGUMENT) or oversized (RESOURCE_EXHAUSTED) request."""
        self.metrics.rpc_refused(method, code)

    async def __aenter__(self) -> ProxyServer:
        await self.start()  # returns once the server is bound and serving
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self, grace_s: float = 1.0) -> None:
        """Stop taking calls, let running ones end for grace_s, then release everything.

        Held receives do not wait for the grace to run out: they are answered at once with
        what they hold, usually nothing (MESSAGE_NOT_FOUND, as any empty long poll), so a
        client sees a normal empty receive and polls again elsewhere."""
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        self.strategy.drain()
        await self._server.stop(grace_s)
        self._server = None
        if self._admin_server is not None:
            await self._admin_server.stop(grace_s)
            self._admin_server = None
        await self.tasks.aclose()
        await self.streams.aclose()
        await self.admission.aclose()
        await self.strategy.aclose()
        await self.cluster.aclose()
