"""The edge's answer to every kind of path, by who calls (review of proxy/grpc/edge.py).

A table pinned from main's interceptors (the same answers, path by path, on both ports): a
stranger is refused on every method of a guarded service, the admin services need admin,
health stays open, and a path no service has (odd case, prefix, suffix, another service's) is
UNIMPLEMENTED for everyone, never served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf import message_factory
from popmq.broker.contract.errors import Code
from popmq.proxy.grpc.access import _method_descriptor

pytestmark = pytest.mark.slow

USER = ("paths-user", "paths-secret-0001")
ROOT = ("paths-root", "paths-secret-0002")
MS = "/apache.rocketmq.v2.MessagingService/"
ADMIN = "/popmq.admin.v1.AdminService/"
UPSTREAM = "/apache.rocketmq.v2.Admin/"
HEALTH = "/grpc.health.v1.Health/Check"
NO_SUCH = [
    MS + "Nope", MS + "sendMessage", "/apache.rocketmq.v2.messagingservice/SendMessage",
    "/" + MS + "SendMessage", MS + "SendMessage?x=1", "/x" + MS + "SendMessage",
    "/apache.rocketmq.v2.MessagingServiceX/SendMessage", "/apache.rocketmq.v2.MessagingService",
    ADMIN, ADMIN + "Nope", ADMIN + "listTopics", UPSTREAM + "Nope", "/grpc.health.v1.Health/Nope",
    "/popmq.broker.v1.BrokerService/Pop", "/", "",
]  # fmt: skip
REFUSED, UNIMPLEMENTED = "refused", grpc.StatusCode.UNIMPLEMENTED.name


def _acl(tmp_path: Path) -> Path:
    acl = tmp_path / "acl.yaml"
    acl.write_text(
        yaml.safe_dump(
            {
                "users": [
                    {"access_key": USER[0], "secret_key": USER[1],
                     "allow": [{"publish": "t-*"}, {"subscribe": "g-*"}]},
                    {"access_key": ROOT[0], "secret_key": ROOT[1], "admin": True},
                ]
            }
        )
    )  # fmt: skip
    return acl


async def _answer(channel: grpc.aio.Channel, path: str, metadata: Any) -> str:
    """The gRPC code's name, or REFUSED (UNAUTHORIZED / FORBIDDEN in the answer's status),
    or OK for anything else the method answered."""
    descriptor = _method_descriptor(path) if path.startswith((MS, ADMIN, UPSTREAM)) else None
    try:
        if descriptor is not None and descriptor.server_streaming:
            frames = [f async for f in channel.unary_stream(path)(b"", metadata=metadata,
                                                                  timeout=10)]  # fmt: skip
        else:
            frames = [await channel.unary_unary(path)(b"", metadata=metadata, timeout=10)]
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return REFUSED  # upstream's ChangeLogLevel has no status in its answer
        return exc.code().name
    if descriptor is not None:
        answer: Any = message_factory.GetMessageClass(descriptor.output_type).FromString(frames[0])
        refusals = (Code.UNAUTHORIZED, Code.FORBIDDEN)
        if "status" in answer.DESCRIPTOR.fields_by_name and answer.status.code in refusals:
            return REFUSED
    return "OK"


async def test_every_path_answers_as_main_did(make_cluster: Any, tmp_path: Path) -> None:
    acl = str(_acl(tmp_path))
    together = await make_cluster(brokers=1, **{"proxy.acl": acl})
    apart = await make_cluster(brokers=1, **{"proxy.acl": acl, "proxy.admin_port": 0})
    expected: dict[tuple[str, str, str], str] = {}
    for port in ("together", "apart", "admin port"):
        for who in ("stranger", "user", "root"):
            for path in NO_SUCH:
                expected[port, who, path] = UNIMPLEMENTED
            expected[port, who, HEALTH] = "OK"
            serves_messaging = port != "admin port"
            serves_admin = port != "apart"
            for path in (MS + "SendMessage", MS + "QueryRoute", MS + "ReceiveMessage"):
                expected[port, who, path] = (
                    REFUSED if who == "stranger" else "OK" if serves_messaging else UNIMPLEMENTED
                )
            if who == "user" and serves_messaging:  # its grants name no empty group
                expected[port, who, MS + "ReceiveMessage"] = REFUSED
            # ChangeLogLevel (no status in its answer: refused by aborting) only where it is
            # refused: root's would change the process's log level.
            admin_paths = [ADMIN + "ListTopics", UPSTREAM + "GetProxyRuntimeStats"]
            for path in admin_paths + [UPSTREAM + "ChangeLogLevel"] * (who != "root"):
                expected[port, who, path] = (
                    UNIMPLEMENTED if not serves_admin and who != "stranger"
                    else "OK" if who == "root" else REFUSED
                )  # fmt: skip
            expected[port, who, ADMIN + "WhoAmI"] = (
                UNIMPLEMENTED if not serves_admin and who != "stranger"
                else REFUSED if who == "stranger" else "OK"
            )  # fmt: skip
    admin_channel = grpc.aio.insecure_channel(f"127.0.0.1:{apart.server.admin_port}")
    seen: dict[tuple[str, str, str], str] = {}
    try:
        for port, cluster, channel in (
            ("together", together, together.channel),
            ("apart", apart, apart.channel),
            ("admin port", apart, admin_channel),
        ):
            for who, signing in (("stranger", None), ("user", USER), ("root", ROOT)):
                cluster.signing = signing
                for _, _, path in [key for key in expected if key[:2] == (port, who)]:
                    seen[port, who, path] = await _answer(channel, path, cluster.metadata())
    finally:
        await admin_channel.close()
    assert {key: got for key, got in seen.items() if got != expected[key]} == {}
