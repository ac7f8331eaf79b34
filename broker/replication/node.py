"""One node of a replicated broker group: the gRPC server, and the role it plays now.

The node serves BrokerService (through ``NodePort``) and ReplicationService on one port. As a
leader it opens its broker on the data directory (recovery rebuilds what a follower did not
copy), records its epoch's first position, and lets followers stream from it; as a follower it
copies its leader's data directory and refuses broker calls. When the role source announces a
new role, the old one is wound down first (a leader stops answering before it closes), then
the new one starts: a static switch, or an election's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import grpc
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.broker.pop.handle_keys import keyring_path
from popmq.broker.replication.completeness import holds_data, holds_whole_copy, mark_complete
from popmq.broker.replication.epochs import EpochHistory, StaleEpochError
from popmq.broker.replication.files import list_segments, log_end
from popmq.broker.replication.follower import MAX_MESSAGE_BYTES, ReplicaFollower
from popmq.broker.replication.leader import ReplicationLeader
from popmq.broker.replication.metrics import NodeCollector, node_registry
from popmq.broker.replication.port import Leading, NodePort
from popmq.broker.replication.replica import ReplicaWriter
from popmq.broker.replication.role import GroupRole, RoleSource
from popmq.broker.wire.server import BrokerGrpcServer
from prometheus_client import CollectorRegistry

from popmq.clock import SYSTEM, Clock
from popmq.config import BrokerConfig, BrokerLinkConfig
from popmq.pb.replication.v1 import replication_pb2 as pb
from popmq.pb.replication.v1 import replication_pb2_grpc
from popmq.security.link import broker_channel

log = logging.getLogger(__name__)

# A give-up etcd did not take (unreachable, timed out) is tried again this often until it
# works or the role changes: meanwhile the key is still this node's and its keepalives go on.
GIVE_UP_RETRY_S = 1.0
# A follower that cannot follow (its data directory cannot be opened or written, say) refuses
# calls and tries again this often: it catches up by itself once the cause is gone.
FOLLOW_RETRY_S = 5.0


@dataclass(frozen=True, slots=True)
class Promotion:
    """What opening the store cost when this node last began to lead (its recovery walk)."""

    seconds: float
    records_scanned: int
    bytes_scanned: int

    @classmethod
    def of(cls, broker: Broker, seconds: float) -> Promotion:
        report = broker.store.recovery
        if report is None:
            return cls(seconds, 0, 0)
        return cls(seconds, report.records_scanned, report.bytes_scanned)


# How long a follower's stream waits for this node to start leading before it is refused. A
# newly elected leader is named in etcd before it has opened its broker; its followers, told
# at once, dial it then: they wait here instead of backing off (0.5 s and more) after a
# refusal, which made each failover that much longer.
LEADER_WAIT_S = 2.0


class ReplicationGate(replication_pb2_grpc.ReplicationServiceServicer):
    """ReplicationService of the node: the current leader's, or a refusal."""

    def __init__(self, leader_wait_s: float = LEADER_WAIT_S) -> None:
        self._leader: ReplicationLeader | None = None
        self._leading = anyio.Event()  # set while a leader is in place
        self._leader_wait_s = leader_wait_s

    @property
    def leader(self) -> ReplicationLeader | None:
        return self._leader

    @leader.setter
    def leader(self, leader: ReplicationLeader | None) -> None:
        self._leader = leader
        if leader is not None:
            self._leading.set()
        elif self._leading.is_set():
            self._leading = anyio.Event()

    async def Replicate(
        self, request_iterator: AsyncIterator[pb.ReplicaReport], context: Any
    ) -> None:
        with anyio.move_on_after(self._leader_wait_s):
            await self._leading.wait()
        leader = self._leader
        if leader is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "this node is not the leader")
            return
        await leader.Replicate(request_iterator, context)


def role_from_config(config: BrokerConfig) -> GroupRole:
    repl = config.replication
    leader = repl.role == "leader"
    return GroupRole(
        epoch=repl.epoch,
        leader_name=config.name,
        leader_address=f"{config.host}:{config.port}" if leader else (repl.leader or ""),
        is_leader=leader,
    )


def replication_link(config: BrokerConfig) -> BrokerLinkConfig:
    """How a follower reaches its leader's port: as that port is guarded (the same TLS as
    the broker port, and the cluster token). Certificates and keys come from files only."""
    tls, repl = config.tls, config.replication
    cert, key = repl.tls_cert, repl.tls_key
    if cert is None and tls.client_ca is not None:  # the leader asks for a client certificate
        cert, key = tls.cert, tls.key
    return BrokerLinkConfig(
        cluster_token_file=config.cluster_token_file,
        tls=tls.enabled,
        ca=repl.tls_ca or tls.client_ca,
        cert=cert if tls.enabled else None,
        key=key if tls.enabled else None,
        server_name=repl.tls_server_name,
    )


class ReplicatedNode:
    def __init__(
        self, config: BrokerConfig, roles: RoleSource | None = None, *, clock: Clock = SYSTEM
    ) -> None:
        self._config = config
        self._roles: RoleSource | None = roles
        self._clock = clock
        self.port = NodePort(config.name)
        self._gate = ReplicationGate()
        self._server = BrokerGrpcServer(
            self.port, config.host, config.port, config=config,
            services=[lambda server: replication_pb2_grpc.add_ReplicationServiceServicer_to_server(
                self._gate, server)],
        )  # fmt: skip
        self.node = config.replication.node or ""
        self.role: GroupRole | None = None
        self.follower: ReplicaFollower | None = None
        self.promotion: Promotion | None = None  # the last time this node opened its store
        # The epoch this node last answered calls in as its leader (see _give_up): about the
        # epoch, not the attempt, since the same epoch may be played again (a give-up whose
        # delete was cancelled, the key read back as this node's).
        self._served_epoch = 0
        self._followed = False  # the last follow applied batches (a failure after: a new stretch)

    @property
    def bound_port(self) -> int:
        return self._server.bound_port

    @property
    def leader(self) -> ReplicationLeader | None:
        return self._gate.leader

    def metrics_registry(self, *, role_gauges: bool = True) -> CollectorRegistry:
        """The node's /metrics: the running broker's metrics and popmq_ha_* (the role's
        gauges only with ``role_gauges``: an elected node's come from its election)."""
        collector = NodeCollector(self._config.name, lambda: self.node, lambda: self.role,
                                  self._running_broker, lambda: self._gate.leader,
                                  role_gauges=role_gauges,
                                  promotion=lambda: self.promotion)  # fmt: skip
        return node_registry(collector)

    def holds_whole_copy(self) -> bool:
        """Whether this node's data may lead the group (the election asks before it
        campaigns): not while it is emptied, or being reset or cut back (completeness.py)."""
        return holds_whole_copy(Path(self._config.data_dir))

    def holds_data(self) -> bool:
        """Whether this node's directory holds any data (an unclean election never elects
        an emptied node in a group that had a leader)."""
        return holds_data(Path(self._config.data_dir))

    def _running_broker(self) -> Broker | None:
        leading = self.port.leading
        return leading.broker if leading is not None else None

    async def start(self) -> None:
        await self._server.start()
        if not self.node:
            self.node = f"{self._config.name}@{self._config.host}:{self._server.bound_port}"

    async def aclose(self, grace_s: float = 1.0) -> None:
        """Stop serving (calls in flight get ``grace_s``); ``run`` is cancelled by its owner."""
        await self._server.aclose(grace_s)

    async def run(self, roles: RoleSource | None = None) -> None:
        """Play the role the source gives, and the next one, until cancelled. ``roles`` is
        given here when it needs the started server (an election registers the bound
        address)."""
        self._roles = roles or self._roles
        if self._roles is None:
            raise ValueError("a replicated node needs a role source")
        role = self._roles.current()
        while True:
            async with anyio.create_task_group() as group:
                group.start_soon(self._play, role)
                new_role = await self._roles.wait_changed(role)
                group.cancel_scope.cancel()
            log.info("replication: %s: role changes from %s to %s", self.node, role, new_role)
            role = new_role

    async def _play(self, role: GroupRole) -> None:
        self.role = role
        try:
            if role.is_leader:
                await self._lead(role)
            else:
                await self._follow_again_and_again(role)
        except Exception as error:  # e.g. the data directory cannot be opened
            self.port.refusal = f"{self.node} cannot play its role (epoch {role.epoch}): {error}"
            self.port.promotion_ended()
            log.error("replication: %s", self.port.refusal, exc_info=True)
            if role.is_leader:  # (what it opened is closed: _lead's own finally)
                await self._give_up(role, str(error))
            await anyio.sleep_forever()  # refuses every call until the role changes
        finally:
            self.port.promotion_ended()

    async def _give_up(self, role: GroupRole, why: str) -> None:
        """A leader that cannot lead hands the role on (an election picks another in-sync
        node) instead of holding it while refusing every call."""
        assert self._roles is not None  # run() has one
        failed = False
        while True:
            try:
                await self._roles.give_up(role, why, served=self._served_epoch == role.epoch)
                return
            except Exception:  # etcd away: the lease still holds the key; tried again
                if not failed:
                    log.exception("replication: %s could not give up leading epoch %d; "
                                  "trying again every %.1f s", self.node, role.epoch,
                                  GIVE_UP_RETRY_S)  # fmt: skip
                failed = True
            await self._clock.sleep(GIVE_UP_RETRY_S)  # until it works or the role changes

    # -- leading -----------------------------------------------------------------------------
    async def _lead(self, role: GroupRole) -> None:
        config, roles = self._config, self._roles
        assert roles is not None  # run() has one
        history = EpochHistory(config.data_dir)
        if role.epoch < history.last_epoch:
            self.port.refusal = (
                f"{self.node} was told to lead epoch {role.epoch}, older than epoch "
                f"{history.last_epoch} it knows: refusing to serve"
            )
            log.error("replication: %s", self.port.refusal)
            await anyio.sleep_forever()
        # Calls that come while the store opens (off the loop: the server answers) wait for
        # the node to lead rather than being refused "starting" (PROMOTION_WAIT_S, port.py).
        self.port.promotion_started()
        data_dir = Path(config.data_dir)
        if not list_segments(data_dir):
            # Nothing written yet (a new group's first leader): its epoch starts at 0 whatever
            # the broker does at start, and recorded now, a crash during that start leaves a
            # copy that may campaign again (completeness.py wants a history).
            history.begin(role.epoch, 0)
        broker = Broker(config, self._clock)
        started = time.monotonic()
        await broker.start(open_off_loop=True)  # keepalives and watches go on meanwhile
        self.promotion = Promotion.of(broker, time.monotonic() - started)
        log.info("replication: %s opened its store for epoch %d in %.3f s (walked %d records, "
                 "%d bytes of commitlog)", self.node, role.epoch, self.promotion.seconds,
                 self.promotion.records_scanned, self.promotion.bytes_scanned)  # fmt: skip
        try:
            try:
                history.begin(role.epoch, log_end(list_segments(data_dir)))
            except StaleEpochError as error:
                self.port.refusal = str(error)
                self.port.promotion_ended()
                await anyio.sleep_forever()
            # What this node leads is the group's copy now (an unclean election may have
            # picked a copy marked incomplete): it may campaign again later.
            mark_complete(data_dir)
            own_keyring = keyring_path(config).parent == Path(config.data_dir)
            leader = ReplicationLeader(
                Path(config.data_dir), self.node, role, roles, config.replication, history,
                clock=self._clock, copy_keyring=own_keyring,
            )  # fmt: skip
            async with leader:
                await leader.reevaluate()  # report the in-sync set (this node) at once
                self._gate.leader = leader
                self.port.leading = Leading(broker, LocalBrokerPort(broker), leader)
                self._served_epoch = role.epoch
                self.port.promotion_ended()
                log.info("replication: %s leads epoch %d (%s, min in sync %d)", self.node,
                         role.epoch, config.replication.mode,
                         config.replication.min_in_sync)  # fmt: skip
                try:
                    await anyio.sleep_forever()
                finally:
                    # Stop answering first: nothing is acknowledged once the role is gone.
                    self.port.leading = None
                    self.port.refusal = f"{self.node} stopped leading epoch {role.epoch}"
                    self._gate.leader = None
        finally:
            with anyio.CancelScope(shield=True):
                await broker.aclose()

    # -- following ---------------------------------------------------------------------------
    async def _follow_again_and_again(self, role: GroupRole) -> None:
        """Follow; after a failure the stream's own retries do not cover, refuse calls and try
        again every FOLLOW_RETRY_S (ERROR once a stretch; the leader's lag metrics and the
        in-sync set show the follower behind meanwhile)."""
        failures = 0
        while True:
            self._followed = False
            try:
                await self._follow(role)
                return
            except Exception as error:
                if self._followed:  # it followed since the last failure: a new stretch
                    failures = 0
                self.port.refusal = (f"{self.node} cannot follow (epoch {role.epoch}): {error}; "
                                     f"trying again every {FOLLOW_RETRY_S:g} s")  # fmt: skip
                if failures == 0:
                    log.error("replication: %s", self.port.refusal, exc_info=True)
                else:
                    log.debug("replication: %s", self.port.refusal)
                failures += 1
            await self._clock.sleep(FOLLOW_RETRY_S)

    async def _follow(self, role: GroupRole) -> None:
        if not role.leader_address:  # an election is under way: wait for its result
            self.port.refusal = f"{self.node}: the group has no leader now"
            await anyio.sleep_forever()
        self.port.refusal = (f"{self.node} is a follower (epoch {role.epoch}); the leader is "
                             f"{role.leader_name or '?'} at {role.leader_address}")  # fmt: skip
        writer = ReplicaWriter(Path(self._config.data_dir), clock=self._clock)
        writer.open()
        follower: ReplicaFollower | None = None
        try:
            follower = self.follower = ReplicaFollower(
                writer, self.node, role, self._channel_factory(), clock=self._clock
            )
            await follower.run()
        finally:
            self.follower = None
            self._followed = follower is not None and follower.batches > 0
            writer.close()

    def _channel_factory(self) -> Callable[[str], grpc.aio.Channel]:
        link = replication_link(self._config)
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        return lambda address: broker_channel(address, options, link)
