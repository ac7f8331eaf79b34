"""The proxy's servers run no grpc interceptor (proxy/grpc/edge.py): namespaces and the access
guard are done in the one generic handler's lookup, and still refuse a stranger from the
headers alone, before the request is read (docs/benchmarks.md, "Idle CPU, wave 12")."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from popmq.broker.contract.errors import Code
from popmq.proxy.grpc.access import AccessGuard
from popmq.proxy.grpc.namespace import NamespaceInterceptor
from proxy_support import message, unique

from popmq import handing
from popmq.pb.admin.v1 import admin_pb2 as a
from popmq.pb.admin.v1 import admin_pb2_grpc
from popmq.pb.rocketmq.v2 import service_pb2 as s

pytestmark = pytest.mark.slow

USER = ("edge-user", "edge-secret-0001")
ROOT = ("edge-root", "edge-secret-0002")
CONSUMER = ("edge-consumer", "edge-secret-0003")


def _acl(tmp_path: Path) -> Path:
    acl = tmp_path / "acl.yaml"
    acl.write_text(
        yaml.safe_dump(
            {
                "users": [
                    {"access_key": USER[0], "secret_key": USER[1],
                     "allow": [{"publish": "t-*", "namespace": "prod"}]},
                    {"access_key": ROOT[0], "secret_key": ROOT[1], "admin": True},
                    {"access_key": CONSUMER[0], "secret_key": CONSUMER[1],
                     "allow": [{"publish": "t-*"}, {"subscribe": "g-*"}]},
                ]
            }
        )
    )  # fmt: skip
    return acl


async def test_no_interceptor_runs_and_strangers_are_refused_unread(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Any] = []
    real = grpc.aio.server

    def recording(*args: Any, **kwargs: Any) -> Any:
        made.append(kwargs.get("interceptors"))
        return real(*args, **kwargs)

    intercepted: list[str] = []

    async def never(self: Any, continuation: Any, details: Any) -> Any:
        intercepted.append(details.method)
        return await continuation(details)

    monkeypatch.setattr(grpc.aio, "server", recording)
    monkeypatch.setattr(AccessGuard, "intercept_service", never)
    monkeypatch.setattr(NamespaceInterceptor, "intercept_service", never)
    cluster = await make_cluster(
        brokers=1,
        **{"proxy.acl": str(_acl(tmp_path)), "proxy.max_request_bytes": 1 << 20,
           "proxy.admin_port": 0},
    )  # fmt: skip
    assert len(made) == 2 and not any(made)  # the client port's server and the admin port's
    # A stranger's request past the receive limit is answered from its headers: read, it
    # would fail in the transport (as the signed one below does).
    huge = s.SendMessageRequest(messages=[message("t-x", b"x" * (2 << 20))])
    answer = await cluster.stub.SendMessage(huge, metadata=cluster.metadata(), timeout=30)
    assert answer.status.code == Code.UNAUTHORIZED
    cluster.signing = USER
    with pytest.raises(grpc.aio.AioRpcError) as read:
        await cluster.stub.SendMessage(huge, metadata=cluster.metadata(), timeout=30)
    assert read.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Namespaces outside the guard: the user may publish on prod%t-* only.
    topic = unique("t")
    small = s.SendMessageRequest(messages=[message(topic, b"a")])
    outside = await cluster.stub.SendMessage(small, metadata=cluster.metadata())
    assert outside.status.code == Code.FORBIDDEN
    inside = await cluster.stub.SendMessage(
        small, metadata=(*cluster.metadata(), ("x-mq-namespace", "prod"))
    )
    assert inside.status.code == Code.OK
    assert inside.entries[0].status.code == Code.OK
    # The admin port's guard: admin only.
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cluster.server.admin_port}") as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        refused = await admin.ListTopics(a.ListTopicsRequest(), metadata=cluster.metadata())
        assert refused.status.code == Code.FORBIDDEN
        cluster.signing = ROOT
        listed = await admin.ListTopics(a.ListTopicsRequest(), metadata=cluster.metadata())
        assert "prod%" + topic in {t.name for t in listed.topics}
    assert intercepted == []


@pytest.mark.skipif(
    hasattr(inspect, "markcoroutinefunction"),
    reason="Python 3.12+ marks the plain functions: no _HandingFunction layer to count",
)
async def test_a_receive_calls_one_handing_function(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """grpc.aio calls a method's outer handing function (popmq.handing); the layers inside it
    (namespaces, the access guard, the undecodable-body check, the servicer's receive) call
    each other's plain functions: one handing call per receive (main: four)."""
    called: list[str] = []
    real = handing._HandingFunction.__call__

    def counting(self: Any, request: Any, context: Any) -> Any:
        called.append(self.__name__)
        return real(self, request, context)

    monkeypatch.setattr(handing._HandingFunction, "__call__", counting)
    cluster = await make_cluster(brokers=1, **{"proxy.acl": str(_acl(tmp_path))})
    cluster.signing = CONSUMER
    topic = unique("t")
    assert (await cluster.route(topic)).status.code == Code.OK
    called.clear()
    status, messages, kinds = await cluster.receive(unique("g"), topic, poll_ms=300)
    assert status.code == Code.MESSAGE_NOT_FOUND and not messages
    assert kinds == ["status", "delivery_timestamp"]
    assert called == ["call"]  # the namespace wrapper's, which grpc.aio calls
