"""Replication streams run on the broker port, so they get its TLS: a follower dials its
leader over TLS (mutual here), verifying it with the configured CA and presenting its client
certificate, all from files (throwaway test PKI, tests/support/tls_certs.py). Before, the
follower dialled plaintext and never reached a leader whose port served TLS."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import anyio
import grpc
import pytest
from popmq.broker.contract.types import Message, PopRequest
from popmq.broker.replication.node import ReplicatedNode, replication_link
from popmq.broker.replication.role import GroupRole, StaticRoleSource
from support.tls_certs import make_pki

from popmq.config import BrokerConfig, ReplicationConfig, StoreConfig, TlsConfig
from popmq.pb.replication.v1 import replication_pb2 as pb
from popmq.pb.replication.v1 import replication_pb2_grpc

pytestmark = pytest.mark.wallclock


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        await anyio.sleep(0.05)


async def test_replication_runs_over_the_broker_ports_mutual_tls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")

    def config(node: str) -> BrokerConfig:
        return BrokerConfig(
            name="broker-t", port=0, data_dir=tmp_path / node, store=StoreConfig(flush="async"),
            tls=TlsConfig(cert=pki.server_cert, key=pki.server_key, client_ca=pki.ca),
            replication=ReplicationConfig(mode="sync", min_in_sync=2, node=node,
                                          tls_cert=pki.client_cert, tls_key=pki.client_key),
        )  # fmt: skip

    link = replication_link(config("t1"))
    assert link.tls and link.ca == pki.ca and link.cert == pki.client_cert
    a = ReplicatedNode(config("t0"), StaticRoleSource(GroupRole(1, "broker-t", "", True)))
    await a.start()
    address = f"127.0.0.1:{a.bound_port}"
    b = ReplicatedNode(config("t1"), StaticRoleSource(GroupRole(1, "broker-t", address, False)))
    await b.start()
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(a.run)
            group.start_soon(b.run)
            await eventually(lambda: a.leader is not None and a.leader.in_sync.size == 2,
                             "the follower never replicated over TLS")  # fmt: skip
            await a.port.create_topic("T", 1)
            await a.port.send([Message(topic="T", body=b"over-tls")])  # sync: t1 has it
            popped = await a.port.pop(PopRequest("G", "T", max_messages=4))
            assert [m.message.body for m in popped.messages] == [b"over-tls"]
            # a stranger in plaintext gets no replication stream
            async with grpc.aio.insecure_channel(address) as channel:
                call = replication_pb2_grpc.ReplicationServiceStub(channel).Replicate()
                with pytest.raises(grpc.aio.AioRpcError):
                    await call.write(pb.ReplicaReport(hello=pb.Hello(node="stranger")))
                    await call.read()
            group.cancel_scope.cancel()
    finally:
        await a.aclose()
        await b.aclose()


def test_the_follower_link_follows_the_broker_ports_settings(tmp_path: Path) -> None:
    plain = replication_link(BrokerConfig(data_dir=tmp_path))
    assert not plain.tls and plain.cert is None
    own = Path("/etc/popmq/tls.crt"), Path("/etc/popmq/tls.key"), Path("/etc/popmq/ca.crt")
    mutual = replication_link(BrokerConfig(
        data_dir=tmp_path, tls=TlsConfig(cert=own[0], key=own[1], client_ca=own[2]),
    ))  # fmt: skip
    # the node's own certificate as its client certificate; the clients' CA verifies the leader
    assert mutual.tls and (mutual.cert, mutual.key, mutual.ca) == own
    server_only = replication_link(BrokerConfig(
        data_dir=tmp_path, tls=TlsConfig(cert=own[0], key=own[1]),
    ))  # fmt: skip
    assert server_only.tls and server_only.cert is None and server_only.ca is None  # system roots
