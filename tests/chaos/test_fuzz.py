"""Fuzz every MessagingService RPC (issue 9: chaos suite).

A real ProxyServer over two in-process brokers runs on its own event loop thread; hypothesis
builds requests from the protocol's descriptors (any field set or not, boundary numbers,
names that are valid, reserved, too long or garbage, Timestamps and Durations out of range)
and sends them over a real gRPC channel. At least 10,000 cases in all, split across the RPCs;
derandomized so a run is repeatable. Every answer must be a gRPC OK with a RocketMQ status
that is not INTERNAL_ERROR (or, for an undecodable body, INVALID_ARGUMENT); the server must
never crash.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message as ProtoMessage
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import PopRequest
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.proxy.server import ProxyServer

from popmq.config import load_config
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

TOTAL_CASES = 10_080
SERVICE = s.DESCRIPTOR.services_by_name["MessagingService"]
TOPIC, GROUP = "fuzz-topic", "fuzz-group"
INTERNAL = {Code.INTERNAL_ERROR, Code.INTERNAL_SERVER_ERROR}

SETTINGS = {
    "proxy.min_long_polling_ms": 0,
    "proxy.max_long_polling_ms": 50,  # long polls end at once: the fuzz stays fast
    "proxy.min_invisible_ms": 10,
    "proxy.strategy": "notify",
    "broker.pop.min_invisible_ms": 0,
    "broker.pop.time_scale": 0.001,
    "broker.topics.queue_count": 2,
    "broker.topics.auto_create": False,  # random names must not create topics
}

_QUEUE = 'message_queue { topic { name: "fuzz-topic" } id: 0 broker { name: "broker-0" } }'
_MESSAGE = (
    'topic { name: "fuzz-topic" } body: "hello" system_properties { message_id: "ID1" '
    "body_encoding: IDENTITY message_type: NORMAL born_timestamp { seconds: 1800000000 } "
    'born_host: "h" }'
)
# A valid request per RPC; most cases change a few of its fields.
TEMPLATES = {
    "QueryRoute": 'topic { name: "fuzz-topic" }',
    "Heartbeat": 'group { name: "fuzz-group" } client_type: SIMPLE_CONSUMER',
    "SendMessage": f"messages {{ {_MESSAGE} }}",
    "QueryAssignment": 'topic { name: "fuzz-topic" } group { name: "fuzz-group" }',
    "ReceiveMessage": f'group {{ name: "fuzz-group" }} {_QUEUE} '
    'filter_expression { type: TAG expression: "*" } batch_size: 4 '
    "invisible_duration { seconds: 1 } long_polling_timeout { nanos: 20000000 }",
    "AckMessage": 'group { name: "fuzz-group" } topic { name: "fuzz-topic" } '
    'entries { message_id: "ID1" receipt_handle: "x.y" }',
    "ForwardMessageToDeadLetterQueue": 'group { name: "fuzz-group" } '
    'topic { name: "fuzz-topic" } receipt_handle: "x.y" message_id: "ID1" '
    "delivery_attempt: 1 max_delivery_attempts: 16",
    "PullMessage": f'group {{ name: "fuzz-group" }} {_QUEUE} offset: 0 batch_size: 4 '
    'filter_expression { type: TAG expression: "*" } long_polling_timeout { nanos: 20000000 }',
    "UpdateOffset": f'group {{ name: "fuzz-group" }} {_QUEUE} offset: 1',
    "GetOffset": f'group {{ name: "fuzz-group" }} {_QUEUE}',
    "QueryOffset": f"{_QUEUE} query_offset_policy: TIMESTAMP timestamp {{ seconds: 1800000000 }}",
    "NotifyClientTermination": 'group { name: "fuzz-group" }',
    "ChangeInvisibleDuration": 'group { name: "fuzz-group" } topic { name: "fuzz-topic" } '
    'receipt_handle: "x.y" invisible_duration { seconds: 1 } message_id: "ID1"',
    "Telemetry": "settings { client_type: SIMPLE_CONSUMER subscription { group { name: "
    '"fuzz-group" } subscriptions { topic { name: "fuzz-topic" } expression { type: TAG '
    'expression: "*" } } } }',
}

_NAMES = st.sampled_from(
    [TOPIC, GROUP, "", " ", "%RETRY%x+y", "%DLQ%" + GROUP, "%SYS%TIMER", "a" * 128, "g" * 121,
     "x" * 300, "bad name", "é", "a+b", "fuzz-topic\x00", "broker-0", "broker-1"]
)  # fmt: skip
_INT64 = st.one_of(
    st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 253_402_300_800]),
    st.integers(-(2**63), 2**63 - 1),
)


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return st.one_of(_NAMES, st.text(max_size=24))
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:
        return st.one_of(
            st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-5, 200)
        )
    if t in (
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SFIXED32,
    ):
        return st.one_of(st.sampled_from([0, 1, -1, 2**31 - 1]), st.integers(-(2**31), 2**31 - 1))
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if t in (
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_SFIXED64,
    ):
        return _INT64
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=False, width=32)
    raise AssertionError(f"unhandled field type {t}")


_NANOS = st.one_of(
    st.sampled_from([0, 1, -1, 999_999_999, 1_000_000_000, -(2**31)]),
    st.integers(-(2**31), 2**31 - 1),
)
# Timestamps and Durations: always both fields, the interesting values first (in range, ms in
# the seconds field, out of range, wrong nanos).
_TIME = st.fixed_dictionaries(
    {
        "seconds": st.one_of(
            st.sampled_from([0, 1, 1_800_000_000, 1_800_000_000_000, 10**17, -(10**12)]),
            _INT64,
        ),
        "nanos": _NANOS,
    }
)
_TIME_TYPES = ("google.protobuf.Timestamp", "google.protobuf.Duration")


def _message(
    descriptor: Descriptor, depth: int, sparse: bool = False
) -> st.SearchStrategy[dict[str, Any]]:
    """Field values of a message (a dict), each field present or not (``sparse``: mostly
    not, to mutate a valid template a few fields at a time)."""
    if descriptor.full_name in _TIME_TYPES:
        return _TIME
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                value = st.dictionaries(st.text(max_size=8), st.text(max_size=16), max_size=3)
            elif field.message_type.full_name in _TIME_TYPES:
                value = _TIME  # cheap, and where the bugs were: at any depth
            elif depth <= 0:
                continue
            else:
                value = _message(field.message_type, depth - 1, sparse)
        else:
            value = _scalar(field)
        if field.is_repeated and not (
            field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry
        ):
            value = st.lists(value, max_size=2)
        if sparse:  # present one time in six
            fields[field.name] = st.integers(0, 5).flatmap(
                lambda i, value=value: value if i == 0 else st.none()
            )
        else:
            fields[field.name] = st.one_of(st.none(), value)
    return st.fixed_dictionaries(fields)


def _fill(target: ProtoMessage, values: dict[str, Any], overwrite: bool = False) -> None:
    descriptor = target.DESCRIPTOR
    for name, value in values.items():
        if value is None:
            continue
        field = descriptor.fields_by_name[name]
        if (
            not overwrite
            and field.containing_oneof is not None
            and target.WhichOneof(field.containing_oneof.name)
        ):
            continue  # one member of a oneof at most
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                getattr(target, name).update(value)
            elif field.is_repeated:
                items = getattr(target, name)
                for index, item in enumerate(value):
                    # Mutating: change the template's entries in place, then add more.
                    existing = overwrite and index < len(items)
                    _fill(items[index] if existing else items.add(), item, overwrite)
            else:
                _fill(getattr(target, name), value, overwrite)
                getattr(target, name).SetInParent()
        elif field.is_repeated:
            if overwrite and value:
                del getattr(target, name)[:]
            getattr(target, name).extend(value)
        else:
            setattr(target, name, value)


def _request(method_name: str) -> st.SearchStrategy[ProtoMessage]:
    method = SERVICE.methods_by_name[method_name]
    cls = getattr(s, method.input_type.name)

    text = TEMPLATES.get(method_name, "")
    if HANDLES:  # a real receipt handle reaches past the signature check
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

    random = _message(method.input_type, depth=2).map(build)
    # Mostly: a valid request with a few fields changed, which reaches the deep paths.
    mutated = _message(method.input_type, depth=3, sparse=True).map(mutate)
    # A share of raw garbage bodies: they must be refused, not crash anything.
    garbage = st.binary(min_size=1, max_size=48)
    return st.one_of(mutated, mutated, mutated, random, garbage)


class ServerThread:
    """ProxyServer + two brokers on their own loop (the test drives them over gRPC)."""

    def __init__(self, root: Path, extra_settings: dict[str, Any] | None = None) -> None:
        self.root = root
        self.extra_settings = extra_settings or {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.brokers: list[Broker] = []
        self.server: ProxyServer | None = None

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def start(self) -> int:
        self.thread.start()
        settings_ = dict(SETTINGS, **{"serve.data_dir": str(self.root)}, **self.extra_settings)
        config = load_config(None, settings_, environ={})

        async def up() -> int:
            for i in range(2):
                broker_config = config.broker.model_copy(
                    update={"name": f"broker-{i}", "data_dir": self.root / f"broker-{i}"}
                )
                broker = Broker(broker_config)
                await broker.start()
                self.brokers.append(broker)
                await broker.create_topic(TOPIC, 2)
                await broker.send([_stored_message(n) for n in range(20)])
                popped = await broker.pop(
                    PopRequest(GROUP, TOPIC, max_messages=4, invisible_time_ms=3_600_000)
                )
                HANDLES.extend(p.receipt_handle for p in popped.messages)
            config.proxy.port = 0
            self.server = ProxyServer(config, [LocalBrokerPort(b) for b in self.brokers])
            await self.server.start()
            return self.server.port

        return self._run(up())

    def stop(self) -> None:
        async def down() -> None:
            if self.server is not None:
                await self.server.aclose(0.5)
            for broker in self.brokers:
                await broker.aclose()

        self._run(down())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _stored_message(n: int) -> Any:
    from popmq.broker.contract.types import Message

    return Message(TOPIC, f"seed-{n}".encode())


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[grpc.Channel]:
    server = ServerThread(tmp_path_factory.mktemp("fuzz"))
    port = server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as chan:
        yield chan
    server.stop()


METADATA = (
    ("x-mq-language", "PYTHON"),
    ("x-mq-protocol", "GRPC_V2"),
    ("x-mq-client-version", "5.1.2"),
    ("x-mq-client-id", f"fuzz@{uuid.uuid4().hex[:8]}"),
    ("x-mq-namespace", ""),
)
TALLY: Counter[str] = Counter()
HANDLES: list[str] = []  # receipt handles of seeded messages, popped at setup


def _identity(data: Any) -> bytes:
    return data if isinstance(data, bytes) else data.SerializeToString()


def _call(chan: grpc.Channel, method_name: str, request: ProtoMessage | bytes) -> list[Any]:
    """One RPC; returns the answers' statuses (RocketMQ ones). Raises on a gRPC failure
    other than INVALID_ARGUMENT for an undecodable body."""
    method = SERVICE.methods_by_name[method_name]
    path = f"/{SERVICE.full_name}/{method_name}"
    out = getattr(s, method.output_type.name)
    if method.client_streaming and method.server_streaming:
        stub = chan.stream_stream(path, _identity, out.FromString)
        call = stub(iter([request]), metadata=METADATA, timeout=5)
    elif method.server_streaming:
        stub = chan.unary_stream(path, _identity, out.FromString)
        call = stub(request, metadata=METADATA, timeout=5)
    else:
        stub = chan.unary_unary(path, _identity, out.FromString)
        call = None
    try:
        answers = list(call) if call is not None else [stub(request, metadata=METADATA, timeout=5)]
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.INVALID_ARGUMENT and isinstance(request, bytes):
            TALLY["invalid_argument"] += 1
            return []
        raise AssertionError(f"{method_name}: gRPC {error.code()} {error.details()}") from None
    return [a.status for a in answers if a.HasField("status")]


RPCS = [m.name for m in SERVICE.methods]
PER_RPC = -(-TOTAL_CASES // len(RPCS))


@pytest.mark.parametrize("method_name", RPCS)
def test_fuzz_rpc(channel: grpc.Channel, method_name: str) -> None:
    @settings(
        max_examples=PER_RPC,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(request=_request(method_name))
    def run(request: ProtoMessage | bytes) -> None:
        TALLY["cases"] += 1
        for status in _call(channel, method_name, request):
            TALLY[f"code:{status.code}"] += 1
            assert status.code not in INTERNAL, (method_name, status, request)

    run()


def test_fuzz_totals(channel: grpc.Channel) -> None:
    """Runs last (pytest keeps file order): the whole fuzz ran its cases and the server is
    still healthy."""
    assert TALLY["cases"] >= 10_000, TALLY
    assert not any(TALLY[f"code:{int(code)}"] for code in INTERNAL)
    route = _call(channel, "QueryRoute", s.QueryRouteRequest(topic=pb.Resource(name=TOPIC)))
    assert route and route[0].code == Code.OK
    print(f"\nfuzz: {TALLY['cases']} cases over {len(RPCS)} RPCs; codes {dict(TALLY)}")
