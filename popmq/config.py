"""One typed configuration model for every popmq process (sources merged by pydantic-settings).

The CLI, the broker and proxy servers, and the Helm chart's ConfigMap all load this model.
Sources, lowest precedence first: built-in defaults (RocketMQ's where one exists), a YAML or
JSON file, environment variables ``POPMQ_<SECTION>__<FIELD>`` (e.g.
``POPMQ_PROXY__MIN_LONG_POLLING_MS=2000``), then command-line flags.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from popmq.event_loop import EventLoopChoice

ENV_PREFIX = "POPMQ_"

# Copies of one request's bytes a process holds at its peak while serving it, measured with
# the kernel's peak RSS (VmHWM) on real processes (docs/operations.md, sizing; the chaos memory
# tests assert them). The Helm chart's memory limits are checked against these
# (tests/deploy/test_memory_sizing.py). grpcio's own receive holds 3 copies at once (its C
# buffer, a bytes per slice, their join), before any handler runs; a large send is then decoded
# without its bodies (popmq.broker.wire.bodies), so while it is served a proxy holds it about
# once (grpc's bytes, which the bodies point into), and a broker writes the bodies it stores
# from there (popmq.broker.store.writer): both peak in grpc's receive.
BROKER_COPIES_PER_REQUEST = 3  # a 25 x 4 MiB unary send (105 MB): +315..316 MB (was +382..594)
PROXY_COPIES_PER_REQUEST = 3  # a 32 x 4 MiB send (134 MB): +391..406 MB, grpc's receive
PROXY_COPIES_WHILE_SERVED = 1  # the same send while the proxy sends it on: +167 MB (was +388)
PROCESS_BASELINE_BYTES = 128 << 20  # an idle broker or proxy: ~80 MB, with room

# RocketMQ's messageDelayLevel, the backoff between POP redeliveries.
DEFAULT_RETRY_LEVELS = [
    "1s", "5s", "10s", "30s", "1m", "2m", "3m", "4m", "5m", "6m",
    "7m", "8m", "9m", "10m", "20m", "30m", "1h", "2h",
]  # fmt: skip

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str | int | float) -> int:
    """'1s' -> 1000, '2m' -> 120000; a bare number is already milliseconds."""
    if isinstance(text, int | float):
        return int(text)
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"bad duration {text!r}: use e.g. 500ms, 10s, 2m, 1h")
    return int(float(match.group(1)) * _UNIT_MS[match.group(2)])


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class StoreConfig(Section):
    """The broker's durable store."""

    flush: Literal["sync", "async"] = "async"
    # async flush: at most this much acknowledged data can be lost on a power cut / kill -9
    # of the machine (a process crash alone loses nothing written to the page cache).
    flush_interval_ms: int = Field(500, ge=1)
    # The queue indexes' fsyncs and checkpoint.json (recovery's start point); 0: at every
    # flush (the default). They make nothing acknowledged durable, but recovery notices a
    # commitlog tail lost after a crash (a deleted last segment) only by the extents of a
    # checkpoint that saw it: a longer interval saves flush-thread CPU (a metafile and an
    # fsync per index file) and widens that window.
    checkpoint_interval_ms: int = Field(0, ge=0)
    segment_bytes: int = Field(64 * 1024 * 1024, ge=4096)
    retention_hours: float = Field(72.0, gt=0)
    retention_bytes: int = Field(0, ge=0)  # 0 = no size limit
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1)
    # Open index and old-segment descriptors kept at most (least recently used closed first);
    # the active commitlog segment is one more. Bounds the store's fds however many queues.
    max_open_files: int = Field(256, ge=8)


class TopicDefaults(Section):
    """Topics created on first use (QueryRoute, send): a flood of new names must not exhaust
    the broker, so auto-creation has a total cap and a rate (a token bucket, burst = rate)."""

    auto_create: bool = True  # RocketMQ's autoCreateTopicEnable
    queue_count: int = Field(8, ge=1, le=1024)
    max_auto_created: int = Field(10_000, ge=0)
    auto_create_per_second: float = Field(100.0, gt=0)
    # An auto-created topic's message type: that of its first message, or MIXED (any type).
    auto_create_message_type: Literal["first_message", "MIXED"] = "first_message"


class GroupDefaults(Section):
    """Consumer groups created on first use (receive, settings), capped like topics."""

    auto_create: bool = True  # RocketMQ's autoCreateSubscriptionGroup
    max_auto_created: int = Field(100_000, ge=0)
    auto_create_per_second: float = Field(1_000.0, gt=0)


class PopConfig(Section):
    """POP bookkeeping, revive and retry policy (broker side)."""

    max_batch: int = Field(32, ge=1, le=1024)
    min_invisible_ms: int = Field(10_000, ge=0)
    max_invisible_ms: int = Field(12 * 3_600_000, ge=1)
    retry_first_percent: int = Field(20, ge=0, le=100)
    retry_levels: list[str] = Field(default_factory=lambda: list(DEFAULT_RETRY_LEVELS))
    max_attempts: int = Field(16, ge=1)
    # A checkpoint not acked within this time is written to the pop journal (RocketMQ's
    # popCkStayBufferTime); acks that come sooner never touch the disk.
    checkpoint_buffer_ms: int = Field(5_000, ge=0)
    revive_scan_interval_ms: int = Field(200, ge=10)
    # Multiplies retry backoff delays; tests set e.g. 0.01 so "1m" takes 0.6 s.
    time_scale: float = Field(1.0, gt=0)
    # popShareQueueNum: how many consumers share one queue in server-side assignment.
    share_queue_num: int = Field(1, ge=1)
    # Timer, revive and DLQ loops: an entry that fails is retried alone, with backoff from
    # loop_backoff_ms doubling up to loop_backoff_max_ms, and parked after park_after_attempts.
    park_after_attempts: int = Field(5, ge=1)
    loop_backoff_ms: int = Field(1_000, ge=1)
    loop_backoff_max_ms: int = Field(60_000, ge=1)

    @field_validator("retry_levels")
    @classmethod
    def _levels_parse(cls, levels: list[str]) -> list[str]:
        if not levels:
            raise ValueError("retry_levels needs at least one level")
        for level in levels:
            parse_duration_ms(level)
        return levels

    def retry_delay_ms(self, reconsume_times: int) -> int:
        """Delay before the Nth redelivery (1-based), scaled; past the last level, the last."""
        index = min(max(reconsume_times, 1), len(self.retry_levels)) - 1
        return int(parse_duration_ms(self.retry_levels[index]) * self.time_scale)


class TransactionConfig(Section):
    """Transactional messages' check-back (RocketMQ's transactionTimeOut,
    transactionCheckInterval and transactionCheckMax)."""

    # A half message is not checked before this (its CHECK_IMMUNITY_TIME_IN_SECONDS property
    # may lengthen it).
    check_immunity_ms: int = Field(6_000, ge=0)
    check_interval_ms: int = Field(30_000, ge=10)
    # Checks without an answer before the half message is parked for an operator.
    max_checks: int = Field(15, ge=1)


class PollingConfig(Section):
    """Broker-side hold table for pop, pull and notification long polls."""

    max_held_per_key: int = Field(1024, ge=1)
    max_held_total: int = Field(100_000, ge=1)
    # A held pop woken by an arrival lets the event loop run up to this many more turns,
    # within fill_window_ms (and its poll time), before it pops, so sends landing meanwhile
    # ride the same pop (fuller receives). A pop that finds messages at once never waits;
    # 0: pop at once. The proxy's notify strategy has its own (proxy.fill_window_turns).
    # docs/longpolling.md, "The fill window".
    fill_window_turns: int = Field(8, ge=0, le=64)
    fill_window_ms: float = Field(2.0, ge=0, le=100)


class TlsConfig(Section):
    """Server-side TLS from PEM files; client_ca turns on client-certificate checks (mTLS)."""

    cert: Path | None = None
    key: Path | None = None
    client_ca: Path | None = None

    @model_validator(mode="after")
    def _pair(self) -> TlsConfig:
        if (self.cert is None) != (self.key is None):
            raise ValueError("tls needs both cert and key")
        if self.client_ca is not None and self.cert is None:
            raise ValueError("tls.client_ca (mutual TLS) needs tls.cert and tls.key")
        return self

    @property
    def enabled(self) -> bool:
        return self.cert is not None


class BrokerLinkConfig(Section):
    """How a proxy reaches its brokers: TLS (ca to verify them; cert/key for mutual TLS) and
    the cluster token file (the same file the brokers read)."""

    tls: bool = False
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    # Name to expect in the brokers' certificates when it differs from the address's host.
    server_name: str | None = None
    cluster_token_file: Path | None = None
    # Hot-path requests (send, pop, ack, notify, pull...): "stream" multiplexes them on a few
    # long-lived Call streams per broker, with ack/send coalescing; "unary" is one RPC each
    # (the fallback; also what a broker without the Call method gets automatically).
    requests: Literal["stream", "unary"] = "stream"
    streams: int = Field(2, ge=1, le=64)  # Call streams per broker
    window: int = Field(1024, ge=1, le=1_000_000)  # requests in flight per stream (not long polls)
    # Acks (per group and topic) and sends (per topic and queue) made within this window go
    # as one request, as RocketMQ's batch ack does; 0 turns coalescing off.
    coalesce_ms: float = Field(1.0, ge=0, le=1000)
    coalesce_max: int = Field(256, ge=1, le=100_000)  # items per coalesced request

    @model_validator(mode="after")
    def _pair(self) -> BrokerLinkConfig:
        if (self.cert is None) != (self.key is None):
            raise ValueError("broker_link needs both cert and key for mutual TLS")
        return self


class EtcdConfig(Section):
    """Where broker groups elect leaders and register members (popmq.coord). No endpoints: no
    etcd (a broker is a group of one; a proxy needs a --broker list)."""

    # Client URLs of the etcd members, e.g. ["http://etcd-0:2379", "http://etcd-1:2379"].
    # NoDecode: an environment value reaches _split as written (pydantic-settings would read
    # it as JSON first, and a plain URL is not JSON).
    endpoints: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Every key popmq writes lives under this prefix (several clusters can share one etcd).
    prefix: str = "/popmq/"
    # A node's lease: a leader that cannot renew it stops acknowledging after this long.
    lease_ttl_s: int = Field(3, ge=2, le=60)
    # Each etcd request's deadline (a dead member costs at most this before the next is tried).
    request_timeout_s: float = Field(2.0, gt=0)

    @field_validator("endpoints", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):  # --etcd URL[,URL...] and POPMQ_*__ENDPOINTS
            if value.lstrip().startswith("["):  # POPMQ_*__ENDPOINTS='["http://...", ...]'
                try:
                    return json.loads(value)
                except ValueError:
                    raise ValueError("endpoints: not a JSON list of URLs") from None
            return [url.strip() for url in value.split(",") if url.strip()]
        return value

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"etcd endpoint {url!r} must be a URL (http://HOST:PORT)")
        return value

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not value.startswith("/") or not value.endswith("/"):
            raise ValueError(f"etcd prefix {value!r} must start and end with '/'")
        return value


class BrokerGroupConfig(Section):
    """A broker group (RocketMQ's master and slaves): nodes sharing one name towards proxies,
    one of them the elected leader. Needs broker.etcd.endpoints; what is copied to the
    followers and how many must hold a write is broker.replication's."""

    # The group's name (what proxies and receipt handles call the broker); broker.name is
    # then this node's name in the group. None: no group. Copies: broker.replication.
    name: str | None = None
    # RocketMQ's enableElectUncleanMaster: let a node outside the in-sync set become leader
    # (it may lack acknowledged writes: an explicit opt-in to lose them for availability).
    unclean_election: bool = False
    # host:port other nodes and proxies reach this node at (default: broker.host and the port).
    advertise: str | None = None


class ReplicationConfig(Section):
    """Copies of this broker on other nodes of its group (broker/replication). Off by default:
    a broker is then a group of one, exactly as without the section."""

    # sync: a send, ack or invisible-time change is answered once min_in_sync nodes (this one
    # counted) made it durable; async: answered at once, copied right after (a leader crash
    # loses what was not copied yet); off: no replication.
    mode: Literal["off", "sync", "async"] = "off"
    # This node's name in the in-sync set (default: NAME@HOST:PORT). The broker name
    # (broker.name) is the group's: every node of a group has the same one.
    node: str | None = None
    # RocketMQ's minInSyncReplicas; below it sends are refused (HA_NOT_AVAILABLE).
    min_in_sync: int = Field(1, ge=1, le=16)
    # RocketMQ's haMaxTimeSlaveNotCatchup: a follower behind for longer leaves the in-sync set.
    max_lag_s: float = Field(15.0, gt=0)
    # How long a write waits for the in-sync followers (then SLAVE_PERSISTENCE_TIMEOUT).
    sync_timeout_ms: int = Field(3_000, ge=1)
    # How often a leader looks for changes to send when no write waits for them.
    poll_ms: int = Field(100, ge=1, le=10_000)
    # The shortest time between two batches to a caught-up follower: a batch acknowledged
    # sooner waits out the rest, so the writes of that time share the next one (fewer, fuller
    # batches; each costs both sides a fixed amount of CPU). 0: the next batch at once.
    batch_interval_ms: float = Field(0, ge=0, le=100)
    # The role when no election decides it (static): leader or follower of `leader` (host:port).
    role: Literal["leader", "follower"] = "leader"
    epoch: int = Field(1, ge=1)
    leader: str | None = None
    # Replication streams run on the broker port, so with broker.tls a follower dials its
    # leader over TLS. tls_ca: the CA to verify the leader's certificate (default: tls.client_ca
    # when set, the usual single-CA set-up, else the system's trusted roots). tls_cert/tls_key:
    # the certificate a follower presents when the port asks for one (tls.client_ca set;
    # default: this node's own tls.cert/tls.key, which must then allow client authentication).
    # tls_server_name: the name to expect in the leader's certificate when it differs from the
    # host of its advertised address.
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_server_name: str | None = None

    @model_validator(mode="after")
    def _follower_needs_leader(self) -> ReplicationConfig:
        if self.mode != "off" and self.role == "follower" and not self.leader:
            raise ValueError("replication.role follower needs replication.leader (host:port)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("replication needs both tls_cert and tls_key")
        return self


class BrokerConfig(Section):
    name: str = "broker-a"
    # brokerClusterName: the `cluster` label of the rocketmq_* metrics.
    cluster: str = "DefaultCluster"
    host: str = "127.0.0.1"
    port: int = Field(10911, ge=0, le=65535)
    # Default: ./data/<name> (so `popmq broker --name broker-b` does not open broker-a's store).
    data_dir: Path = Path("./data/broker-a")
    # Receipt handle keys (a JSON keyring, 0600). None: <data_dir>/handle-keys.json, made with
    # a random key on first start. Point it at a mounted Secret to supply the keys yourself.
    handle_keys_file: Path | None = None
    # TLS on the broker port; with tls.client_ca only proxies holding a client certificate
    # from that CA get in (mutual TLS).
    tls: TlsConfig = Field(default_factory=TlsConfig)
    # A file holding the shared cluster token proxies must present (x-popmq-cluster-token).
    cluster_token_file: Path | None = None
    # Bytes of one gRPC message on the broker port, either way: a proxy's batch send in, a
    # full pop batch out (32 bodies of 4 MiB plus headroom). The broker holds about
    # BROKER_COPIES_PER_REQUEST copies of a request while it serves it: keep this times that
    # well under the pod's memory (docs/operations.md, sizing). Callers without the cluster
    # token are refused from their headers, before any of their request is read.
    max_message_bytes: int = Field(256 * 1024 * 1024, ge=1 << 20, le=2**31 - 1)
    # Bytes of sends and pop answers in flight at once (popmq.budget); past it a send waits
    # inflight_wait_ms for room, then is refused with TOO_MANY_REQUESTS (a pop waits while the
    # budget is full, refused before it takes any message). One send larger than this passes
    # alone.
    max_inflight_bytes: int = Field(256 * 1024 * 1024, ge=1 << 20)
    # How long a call over the budget waits for room: RocketMQ's waitTimeMillsInSendQueue.
    inflight_wait_ms: int = Field(200, ge=0, le=60_000)
    # Serve Prometheus /metrics on this port of `host` (None: not at all; 0: any free port).
    # `popmq serve` ignores it: embedded brokers' metrics are on the proxy's endpoint.
    metrics_port: int | None = Field(None, ge=0, le=65535)
    store: StoreConfig = Field(default_factory=StoreConfig)
    topics: TopicDefaults = Field(default_factory=TopicDefaults)
    groups: GroupDefaults = Field(default_factory=GroupDefaults)
    pop: PopConfig = Field(default_factory=PopConfig)
    polling: PollingConfig = Field(default_factory=PollingConfig)
    replication: ReplicationConfig = Field(default_factory=ReplicationConfig)
    transaction: TransactionConfig = Field(default_factory=TransactionConfig)
    group: BrokerGroupConfig = Field(default_factory=BrokerGroupConfig)
    etcd: EtcdConfig = Field(default_factory=EtcdConfig)

    @model_validator(mode="after")
    def _group_needs_etcd(self) -> BrokerConfig:
        if self.group.name is not None and not self.etcd.endpoints:
            raise ValueError("broker.group.name needs broker.etcd.endpoints (--etcd URL)")
        return self

    def as_group_node(self) -> BrokerConfig:
        """The settings a node of ``group.name`` runs with: the broker (its store, receipt
        handles, what proxies call it) is named after the group, and the node's own name
        (``--name``) is its name in the in-sync set and in etcd. Unchanged without a group."""
        if self.group.name is None:
            return self
        node = self.replication.node or self.name
        return self.model_copy(update={
            "name": self.group.name,
            "replication": self.replication.model_copy(update={"node": node}),
        })  # fmt: skip

    @model_validator(mode="before")
    @classmethod
    def _data_dir_follows_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("data_dir") is None and data.get("name"):
            return {**data, "data_dir": Path("./data") / str(data["name"])}
        return data


class BrokerAddress(Section):
    name: str
    address: str  # host:port

    @classmethod
    def parse(cls, text: str) -> BrokerAddress:
        name, sep, address = text.partition("=")
        if not sep or not name or ":" not in address:
            raise ValueError(f"bad broker {text!r}: expected NAME=HOST:PORT")
        return cls(name=name, address=address)


class ProxyConfig(Section):
    host: str = "127.0.0.1"
    # The `cluster` label of the proxy's rocketmq_* metrics (RocketMQ's proxy cluster name).
    cluster: str = "DefaultCluster"
    port: int = Field(8081, ge=0, le=65535)
    # Address written into routes: clients send every later RPC there.
    advertise_host: str | None = None
    advertise_port: int | None = None
    metrics_port: int | None = Field(None, ge=0, le=65535)
    brokers: list[BrokerAddress] = Field(default_factory=list)
    # With endpoints, the brokers are the groups registered in etcd (their leaders), followed
    # live; `brokers` may stay empty.
    etcd: EtcdConfig = Field(default_factory=EtcdConfig)

    min_long_polling_ms: int = Field(5_000, ge=0)
    max_long_polling_ms: int = Field(20_000, ge=1)
    # Kept back from the client's deadline so the answer arrives before it expires.
    long_polling_reserve_ms: int = Field(100, ge=0)
    # More reserve per receive held now: answering a crowd of polls that end together takes
    # time, and the last answers must still beat their deadlines (1,000 held: +500 ms).
    long_polling_reserve_per_held_ms: float = Field(0.5, ge=0)
    strategy: Literal["pop", "slices", "notify", "adaptive"] = "adaptive"
    # adaptive: pop requests per second (sliding window) at or above which plain pop is used.
    notify_threshold_rps: float = Field(100.0, gt=0)
    notify_window_s: float = Field(10.0, gt=0)
    # adaptive switches back to notify only below threshold * (1 - hysteresis).
    notify_hysteresis: float = Field(0.2, ge=0, lt=1)
    slices_quota: int = Field(8, ge=1)
    slice_ms: int = Field(500, ge=1)
    # After an empty answer, ask every broker (no hold) whether a message was visible, to
    # count false empty responses (popmq_proxy_false_empty_responses_total).
    false_empty_probe: bool = True
    # notify (and adaptive in notify mode): a receive woken from its held poll by a broker's
    # signal lets the event loop run up to this many more turns, within fill_window_ms, before
    # it pops that broker, so sends landing meanwhile ride the same pop (fuller receives, fewer
    # receives and acks per message). A receive that finds messages at once never waits; 0:
    # pop at once. docs/longpolling.md, "The fill window".
    fill_window_turns: int = Field(8, ge=0, le=64)
    fill_window_ms: float = Field(2.0, ge=0, le=100)
    # HOST:PORT of an OTLP/gRPC collector the clients export their own metrics to (the
    # official clients' rocketmq_send_cost_time, rocketmq_process_time, ...), sent to them in
    # their Settings. Empty: clients keep their metrics off.
    client_metrics_endpoint: str = Field("", pattern=r"^([\w.-]+:\d{1,5})?$")

    min_invisible_ms: int = Field(10_000, ge=0)
    max_invisible_ms: int = Field(12 * 3_600_000, ge=1)
    default_invisible_ms: int = Field(60_000, ge=1)
    # PushConsumer receives (auto_renew): pop for one slice, then renew until ack/nack, like
    # RocketMQ's enableProxyAutoRenew / renewSliceTimeMillis / renewAheadTimeMillis /
    # renewSchedulePeriodMillis / renewMaxTimeMillis / maxRenewRetryTimes. Off: such receives
    # get default_invisible_ms once.
    auto_renew: bool = True
    renew_slice_ms: int = Field(60_000, ge=1)
    renew_ahead_ms: int = Field(10_000, ge=0)
    renew_schedule_period_ms: int = Field(5_000, ge=10)
    renew_max_ms: int = Field(3 * 3_600_000, ge=1)
    max_renew_retries: int = Field(3, ge=1)
    max_batch: int = Field(32, ge=1)  # messages per receive
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1)  # RocketMQ's maxMessageSize
    max_send_messages: int = Field(1024, ge=1)  # messages per SendMessage call
    # Bytes of one gRPC request (and answer) the transport takes. None: RocketMQ's proxy's
    # grpcMaxInboundMessageSize, 32 maximal bodies plus 2 MiB. Each request is decoded (into
    # memory) before it is authenticated: lower it where batch sends are small and memory is.
    max_request_bytes: int | None = Field(None, ge=1024)
    # Bytes of one request (a Telemetry command) of any MessagingService method but
    # SendMessage, and of any admin RPC: the largest legal one, an ack of 1,024 entries with
    # 4,096-character handles, takes ~4.3 MiB. A larger one is refused RESOURCE_EXHAUSTED
    # before it is decoded (8 acks of 64 MiB of handles, decoded, grew a proxy by a gigabyte).
    max_small_request_bytes: int = Field(8 * 1024 * 1024, ge=64 * 1024)
    # A ReceiveMessage or PullMessage stream whose client takes no frame for this long is
    # ended: its unsent messages are released (visible again at once), its long-poll slot freed.
    write_stall_timeout_ms: int = Field(30_000, ge=100)
    # Concurrent calls on one client connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): past
    # it the client's own gRPC queues new calls. Above max_long_polls_per_client, so admission
    # control still sheds long polls first, with TOO_MANY_REQUESTS.
    max_streams_per_connection: int = Field(2_000, ge=16)
    # Bytes of sends and of receive answers in flight at once (popmq.budget): past it a call
    # waits inflight_wait_ms for room, then is refused with TOO_MANY_REQUESTS (a refused
    # receive's messages are released at once). The proxy holds about
    # PROXY_COPIES_WHILE_SERVED copies of what is in flight (and grpc's receive, before the
    # budget is asked, PROXY_COPIES_PER_REQUEST of one request): docs/operations.md, sizing.
    max_inflight_bytes: int = Field(160 * 1024 * 1024, ge=1 << 20)
    # How long a call over the budget waits for room: RocketMQ's waitTimeMillsInSendQueue.
    inflight_wait_ms: int = Field(200, ge=0, le=60_000)
    # With an ACL: live client ids one access key may register (a Heartbeat, route lookup or
    # Telemetry settings from one more: TOO_MANY_REQUESTS), and calls it may have open at once
    # over all its connections (receives, pulls, Telemetry streams and short calls alike).
    max_clients_per_access_key: int = Field(1_000, ge=1)
    max_streams_per_access_key: int = Field(10_000, ge=1)
    # Admin reads (QueryMessages, ListDlq, ResendDlq): messages one query may scan per queue
    # and return (asking for more is BAD_REQUEST), and bytes of messages one scan may hold
    # (past them the answer is marked truncated; a resend that needs more is refused).
    admin_max_scan: int = Field(100_000, ge=1)
    admin_max_results: int = Field(10_000, ge=1)
    admin_scan_bytes: int = Field(64 * 1024 * 1024, ge=1 << 20)
    # Admission control: receives held at once, past which TOO_MANY_REQUESTS answers at once.
    max_long_polls: int = Field(10_000, ge=1)
    max_long_polls_per_client: int = Field(1_000, ge=1)  # per client id (or peer address)
    max_long_polls_per_group: int = Field(2_000, ge=1)
    # Shed new long polls while the event loop runs timers this late (CPU starved).
    max_loop_lag_ms: int = Field(1_000, ge=1)
    # `popmq proxy --workers N`: N processes share the port through SO_REUSEPORT (the proxy is
    # stateless), to use more than one core past the GIL. reuse_port is set on each worker.
    workers: int = Field(1, ge=1, le=64)
    reuse_port: bool = False

    # Identity and access (docs/security.md). acl: the users file; None = open (development).
    acl: Path | None = None
    # How far a request's x-mq-date-time may be from now (UTC, or this server's local time).
    auth_clock_skew_ms: int = Field(15 * 60_000, ge=1_000, le=3_600_000)
    # Also accept any zone offset UTC-12..UTC+14 (Python clients in another zone sign with
    # their local time): a wider replay window, see docs/security.md.
    auth_any_timezone: bool = False
    tls: TlsConfig = Field(default_factory=TlsConfig)
    # The admin API on its own listener (same host and TLS); None = on the client port.
    admin_port: int | None = Field(None, ge=0, le=65535)
    broker_link: BrokerLinkConfig = Field(default_factory=BrokerLinkConfig)
    # How often the proxy asks brokers for transactional half messages due for a check-back
    # (the brokers' transaction.check_interval_ms spaces the checks of one message).
    transaction_check_poll_ms: int = Field(1_000, ge=10)

    @model_validator(mode="after")
    def _ordered(self) -> ProxyConfig:
        if self.min_long_polling_ms > self.max_long_polling_ms:
            raise ValueError("min_long_polling_ms must not exceed max_long_polling_ms")
        if self.min_invisible_ms > self.max_invisible_ms:
            raise ValueError("min_invisible_ms must not exceed max_invisible_ms")
        return self


class ServeConfig(Section):
    """`popmq serve`: one proxy with embedded brokers in one process."""

    brokers: int = Field(3, ge=1, le=64)
    data_dir: Path = Path("./data")
    # Prometheus /metrics of `popmq serve` when proxy.metrics_port is not set (null: none).
    # Taken by another process: a free port instead, announced at start like this one.
    metrics_port: int | None = Field(9090, ge=0, le=65535)
    # The web console beside the proxy, on 127.0.0.1 (0: no console). Needs popmq[console].
    console_port: int = Field(8080, ge=0, le=65535)


class ConsoleConfig(Section):
    """The web console (`popmq console`, and the one beside `popmq serve`)."""

    # Reverse proxies (addresses or networks, e.g. ["10.0.0.5", "10.1.0.0/16"]) whose
    # X-Forwarded-For names the client: the console's failed-sign-in limit counts per client
    # address. Empty: X-Forwarded-For is ignored and the TCP peer is the client (a header
    # anyone can write must not buy a fresh address per try). A comma list in the environment.
    trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):  # --trusted-proxy A,B and POPMQ_CONSOLE__TRUSTED_PROXIES
            if value.lstrip().startswith("["):
                try:
                    return json.loads(value)
                except ValueError:
                    raise ValueError("trusted_proxies: not a JSON list of addresses") from None
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"trusted proxy {entry!r} is not an IP address or network (e.g. 10.0.0.5, "
                    "10.1.0.0/16; host names are not resolved)"
                ) from None
        return value


class ServerConfig(Section):
    """The process that serves: `popmq serve`, `popmq proxy` and `popmq broker`."""

    # The asyncio event loop: uvloop (libuv, less CPU per gRPC call; docs/benchmarks.md, "The
    # event loop"), asyncio (the standard library's), or auto (uvloop when installed).
    event_loop: EventLoopChoice = "auto"


class TracingConfig(Section):
    """OpenTelemetry traces (the popmq[otel] extra); OTEL_EXPORTER_OTLP_ENDPOINT works too."""

    # OTLP over gRPC, e.g. http://otel-collector:4317 (empty: tracing off).
    otlp_endpoint: str = ""
    # Empty: popmq-broker, popmq-proxy or popmq-serve (OTEL_SERVICE_NAME wins).
    service_name: str = ""


class PopmqConfig(Section):
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)


def _set_path(target: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = target
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


class ConfigFileError(ValueError):
    """The --config file is not a mapping of sections."""


class ConfigEnvError(ValueError):
    """A POPMQ_* environment value that does not decode (a list or section not in JSON)."""


class _YamlFile(PydanticBaseSettingsSource):
    """The --config file (YAML, so JSON too). A missing file is an error, not an empty config
    (pydantic-settings' own YAML source skips files that do not exist)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self._data: dict[str, Any] = {}
        if path is None:
            return
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigFileError(f"config file {path} must hold a mapping at the top level")
        self._data = loaded

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


class _Environment(EnvSettingsSource):
    """POPMQ_<SECTION>__<FIELD> from the given mapping (os.environ unless a test passes one)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {key.lower(): value for key, value in self._environ.items()}


def _settings_class(path: Path | None, environ: Mapping[str, str]) -> type[BaseSettings]:
    """PopmqConfig's fields as pydantic-settings, with its sources in popmq's precedence:
    keyword arguments (flags, --set) > environment > --config file > defaults."""

    class PopmqSettings(BaseSettings, PopmqConfig):
        model_config = SettingsConfigDict(
            extra="forbid",
            validate_assignment=True,
            env_prefix=ENV_PREFIX,
            env_nested_delimiter="__",
            case_sensitive=False,
        )

        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (
                init_settings,
                _Environment(settings_cls, environ),
                _YamlFile(settings_cls, path),
            )

    return PopmqSettings


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> PopmqConfig:
    """Build the config from defaults < file < environment < overrides (dotted keys allowed)."""
    nested: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_path(nested, key, value)
    settings_cls = _settings_class(
        None if path is None else Path(path), os.environ if environ is None else environ
    )
    try:
        settings = settings_cls(**nested)
    except SettingsError as exc:  # pydantic-settings' own decoding, before validation
        raise ConfigEnvError(
            f"bad config: a {ENV_PREFIX}* environment value did not decode ({exc}); lists "
            "and sections are written in JSON"
        ) from None
    return PopmqConfig.model_validate(settings.model_dump())
