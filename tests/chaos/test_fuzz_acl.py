"""Fuzz every RPC of every service the proxy's port serves with an ACL on (issue 20: "a fuzz
run with an ACL on, over every service, Telemetry and admin included"): MessagingService,
popmq's AdminService, rocketmq-apis' Admin and grpc's Health (its Watch aside).

The proxy of tests/chaos/test_fuzz.py (a real ProxyServer over two in-process brokers, on its
own loop) with `proxy.acl`; every case is one call of one of those RPCs (Telemetry included)
with a random, mutated or undecodable body, made as nobody (no signature), with a bad
signature, with an unknown access key, as a limited user or as an admin. Every answer must be
a RocketMQ status other than INTERNAL_ERROR, or gRPC INVALID_ARGUMENT for an undecodable body
(an answer without a RocketMQ status: gRPC's UNAUTHENTICATED, PERMISSION_DENIED or
INVALID_ARGUMENT; health: NOT_FOUND for an unknown service); never gRPC UNKNOWN or INTERNAL;
the proxy logs no traceback, and answers a plain route lookup at the end.

POPMQ_FUZZ_ACL_CASES sets the number of cases (default 400: about 10 s on the 2-core dev VM,
most of it hypothesis building requests); derandomized, so a run is repeatable. A long run:
`POPMQ_FUZZ_ACL_CASES=8000 pytest tests/chaos/test_fuzz_acl.py -s --timeout=1400` (past
pytest-timeout's 300 s per test).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import text_format
from google.protobuf.message import Message as ProtoMessage
from grpc_health.v1 import health_pb2 as h
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from popmq.broker.contract.errors import Code

from chaos.test_fuzz import GROUP, HANDLES, TEMPLATES, TOPIC, ServerThread, _fill, _message
from popmq.pb.admin.v1 import admin_pb2 as a
from popmq.pb.rocketmq.v2 import admin_pb2 as upstream
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.security.signature import signed_metadata

CASES = int(os.environ.get("POPMQ_FUZZ_ACL_CASES", "400"))
MESSAGING = s.DESCRIPTOR.services_by_name["MessagingService"]
ADMIN = a.DESCRIPTOR.services_by_name["AdminService"]
UPSTREAM = upstream.DESCRIPTOR.services_by_name["Admin"]  # rocketmq-apis' admin
HEALTH = h.DESCRIPTOR.services_by_name["Health"]
MODULES = {MESSAGING: s, ADMIN: a, UPSTREAM: upstream, HEALTH: h}
INTERNAL = {Code.INTERNAL_ERROR, Code.INTERNAL_SERVER_ERROR}
STATUSLESS_CODES = {
    grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
}  # fmt: skip
ROOT, APP = ("root", "root-secret-0001"), ("app", "app-secret-0001")
ACL = f"""
users:
  - access_key: {ROOT[0]}
    secret_key: {ROOT[1]}
    admin: true
  - access_key: {APP[0]}
    secret_key: {APP[1]}
    allow:
      - publish: {TOPIC}
      - subscribe: {{group: {GROUP}, topics: [{TOPIC}]}}
"""
ADMIN_TEMPLATES = {
    "CreateTopic": 'name: "fuzz-made" queue_count: 2',
    "DescribeTopic": f'name: "{TOPIC}"',
    "GetGroup": f'name: "{GROUP}"',
    "UpdateGroup": f'name: "{GROUP}" max_attempts: 3',
    "ListClients": f'group: "{GROUP}" page_size: 2',
    "ConsumerProgress": f'group: "{GROUP}" topic: "{TOPIC}"',
    "ResetOffset": f'group: "{GROUP}" topic: "{TOPIC}"',
    "QueryMessages": f'topic: "{TOPIC}" key: "k" max_scan: 10 limit: 5',
    "ListDlq": f'group: "{GROUP}" limit: 5',
    "ResendDlq": f'group: "{GROUP}" message_ids: "ID1"',
    "TopicRoute": f'topic: "{TOPIC}"',
    "SendTestMessage": f'topic: "{TOPIC}" body: "hi"',
}
# Never a name the other cases rely on: the admin's deletes go to other names.
_KEEP = {"DeleteTopic", "DeleteGroup"}


def _who(name: str) -> list[tuple[str, str]]:
    base = [("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"),
            ("x-mq-client-version", "5.1.2"), ("x-mq-client-id", f"fuzz-acl@{name}")]  # fmt: skip
    if name == "nobody":
        return base
    if name == "bad-signature":
        return base + signed_metadata(APP[0], "not-the-secret")
    if name == "unknown-key":
        return base + signed_metadata("ghost", "ghost-secret")
    if name == "garbled":
        return [*base, ("authorization", "MQv2-HMAC-SHA1 Credential"), ("x-mq-date-time", "x")]
    key, secret = ROOT if name == "admin" else APP
    return base + signed_metadata(key, secret)


WHO = ["nobody", "bad-signature", "unknown-key", "garbled", "app", "app", "admin", "admin"]


def _methods() -> list[tuple[Any, Any]]:
    """Every RPC the proxy's port serves; health's Watch aside (it answers until cancelled)."""
    return [
        (service, method)
        for service in (MESSAGING, ADMIN, UPSTREAM, HEALTH)
        for method in service.methods
        if (service, method.name) != (HEALTH, "Watch")
    ]


def _request(service: Any, method: Any) -> st.SearchStrategy[ProtoMessage | bytes]:
    module = MODULES[service]
    cls = getattr(module, method.input_type.name)
    templates = {MESSAGING: TEMPLATES, ADMIN: ADMIN_TEMPLATES}.get(service, {})
    text = templates.get(method.name, "")
    if HANDLES:
        text = text.replace('"x.y"', f'"{HANDLES[0]}"')
    template = text_format.Parse(text, cls())

    def build(values: dict[str, Any]) -> ProtoMessage:
        request = cls()
        _fill(request, values)
        return request

    def mutate(values: dict[str, Any]) -> ProtoMessage:
        request = cls()
        request.CopyFrom(template)
        _fill(request, values, overwrite=True)
        return request

    def keep_names(request: ProtoMessage | bytes) -> ProtoMessage | bytes:
        if method.name in _KEEP and not isinstance(request, bytes):
            if getattr(request, "name", "") in (TOPIC, GROUP):
                request.name = "fuzz-victim"  # type: ignore[attr-defined]
        return request

    random = _message(method.input_type, depth=2).map(build)
    mutated = _message(method.input_type, depth=3, sparse=True).map(mutate)
    garbage = st.binary(min_size=1, max_size=48)
    return st.one_of(mutated, mutated, random, garbage).map(keep_names)


class LogWatch(logging.Handler):
    """Every record the proxy logs with a traceback (or a traceback in its text)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.tracebacks: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info or "Traceback" in text:
            self.tracebacks.append(f"{record.name}: {text[:300]} {record.exc_info!r}")


@pytest.fixture(scope="module")
def acl_channel(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[grpc.Channel, LogWatch]]:
    root = tmp_path_factory.mktemp("fuzz-acl")
    acl = root / "acl.yaml"
    acl.write_text(ACL)
    os.chmod(acl, 0o600)
    watch = LogWatch()
    logging.getLogger().addHandler(watch)
    server = ServerThread(root / "data", {"proxy.acl": str(acl)})
    try:
        port = server.start()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as chan:
            yield chan, watch
    finally:
        server.stop()
        logging.getLogger().removeHandler(watch)


TALLY: Counter[str] = Counter()


def _identity(data: Any) -> bytes:
    return data if isinstance(data, bytes) else data.SerializeToString()


def _has_status(service: Any, out: Any) -> bool:
    """Whether the answer carries a RocketMQ status (health's `status` is its own enum)."""
    return service is not HEALTH and "status" in out.DESCRIPTOR.fields_by_name


def _call(chan: grpc.Channel, service: Any, method: Any, request: Any, who: str) -> list[Any]:
    path = f"/{service.full_name}/{method.name}"
    out = getattr(MODULES[service], method.output_type.name)
    metadata = _who(who)
    try:
        if method.client_streaming and method.server_streaming:
            stub = chan.stream_stream(path, _identity, out.FromString)
            answers = list(stub(iter([request]), metadata=metadata, timeout=5))
        elif method.server_streaming:
            stub = chan.unary_stream(path, _identity, out.FromString)
            answers = list(stub(request, metadata=metadata, timeout=5))
        else:
            stub = chan.unary_unary(path, _identity, out.FromString)
            answers = [stub(request, metadata=metadata, timeout=5)]
    except grpc.RpcError as error:
        TALLY[f"grpc:{error.code().name}"] += 1
        if error.code() == grpc.StatusCode.INVALID_ARGUMENT and isinstance(request, bytes):
            return []
        if not _has_status(service, out) and error.code() in STATUSLESS_CODES:
            return []  # an answer with no RocketMQ status refuses with gRPC's own code
        if service is HEALTH and error.code() == grpc.StatusCode.NOT_FOUND:
            return []  # the health protocol's answer for a service it does not know
        raise AssertionError(
            f"{method.name} as {who}: gRPC {error.code()} {error.details()} for {request!r}"
        ) from None
    if not _has_status(service, out):
        return []
    return [answer.status for answer in answers if answer.HasField("status")]


def test_fuzz_every_rpc_with_an_acl(acl_channel: tuple[grpc.Channel, LogWatch]) -> None:
    chan, watch = acl_channel
    methods = _methods()
    requests = {id(m): _request(svc, m) for svc, m in methods}

    @settings(
        max_examples=CASES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(pick=st.sampled_from(methods), who=st.sampled_from(WHO), data=st.data())
    def run(pick: tuple[Any, Any], who: str, data: st.DataObject) -> None:
        service, method = pick
        request = data.draw(requests[id(method)])
        TALLY["cases"] += 1
        TALLY[f"as:{who}"] += 1
        for status in _call(chan, service, method, request, who):
            TALLY[f"code:{status.code}"] += 1
            assert status.code not in INTERNAL, (method.name, who, status, request)

    run()
    assert TALLY["cases"] >= CASES, TALLY
    assert watch.tracebacks == [], watch.tracebacks[:5]
    route = _call(chan, MESSAGING, MESSAGING.methods_by_name["QueryRoute"],
                  s.QueryRouteRequest(topic=pb.Resource(name=TOPIC)), "app")  # fmt: skip
    assert route and route[0].code == Code.OK  # still alive and serving
    print(f"\nfuzz with an ACL: {TALLY['cases']} cases over {len(methods)} RPCs; {dict(TALLY)}")
