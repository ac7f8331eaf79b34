"""The generated protocol code: current, importable, and wire-identical to the official client."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "scripts"))
import gen_protos  # noqa: E402

CLIENT_PROTOCOL_DIR = next(
    iter(
        (REPO_ROOT / ".venv-client" / "lib").glob("python3*/site-packages/rocketmq/grpc_protocol")
    ),
    None,
)


def test_committed_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    committed = {p.relative_to(REPO_ROOT): p for p in gen_protos.generated_files(REPO_ROOT)}
    generated_version = _grpc_generated_version(committed)
    tools_version = importlib.metadata.version("grpcio-tools")
    if generated_version != tools_version:
        pytest.skip(
            f"committed code came from grpcio-tools {generated_version}, not {tools_version}"
        )
    fresh = {p.relative_to(tmp_path): p for p in gen_protos.generate(tmp_path)}
    assert sorted(fresh) == sorted(committed), "run: python scripts/gen_protos.py"
    stale = [
        str(rel) for rel, path in fresh.items() if path.read_bytes() != committed[rel].read_bytes()
    ]
    assert not stale, f"stale generated files (run scripts/gen_protos.py): {stale}"


def _grpc_generated_version(files: dict[Path, Path]) -> str:
    for rel, path in files.items():
        if rel.name.endswith("_pb2_grpc.py"):
            match = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", path.read_text())
            if match:
                return match.group(1)
    raise AssertionError("no generated grpc module found")


def test_every_generated_module_imports() -> None:
    for path in gen_protos.generated_files(REPO_ROOT):
        if path.suffix != ".py":
            continue
        module = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
        importlib.import_module(module.removesuffix(".__init__"))


def test_messaging_service_has_every_client_rpc() -> None:
    from popmq.pb.rocketmq.v2 import service_pb2, service_pb2_grpc

    service = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
    assert service.full_name == "apache.rocketmq.v2.MessagingService"
    shapes = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert shapes["ReceiveMessage"] == (False, True)
    assert shapes["PullMessage"] == (False, True)
    assert shapes["Telemetry"] == (True, True)
    for unary in ("QueryRoute", "SendMessage", "AckMessage", "ChangeInvisibleDuration"):
        assert shapes[unary] == (False, False)
    assert hasattr(service_pb2_grpc, "add_MessagingServiceServicer_to_server")


def test_a_received_message_round_trips_through_the_wire_format() -> None:
    from popmq.pb.rocketmq.v2 import definition_pb2 as d
    from popmq.pb.rocketmq.v2 import service_pb2 as s

    frame = s.ReceiveMessageResponse(
        message=d.Message(
            topic=d.Resource(name="orders"),
            user_properties={"k": "v"},
            system_properties=d.SystemProperties(
                message_id="01ABC", tag="TagA", receipt_handle="rh", delivery_attempt=2,
                body_encoding=d.IDENTITY,
                body_digest=d.Digest(type=d.CRC32, checksum="DEADBEEF"),
            ),
            body=b"payload",
        )
    )  # fmt: skip
    decoded = s.ReceiveMessageResponse.FromString(frame.SerializeToString())
    assert decoded.WhichOneof("content") == "message"
    props = decoded.message.system_properties
    assert props.HasField("receipt_handle") and props.receipt_handle == "rh"
    assert not props.HasField("message_group")  # proto3 optional keeps presence
    assert decoded.message.user_properties["k"] == "v"


# -- wire identity with the official client's own generated code --------------------------------


def _client_descriptor(name: str) -> descriptor_pb2.FileDescriptorProto:
    """Parse the serialized descriptor inside the client's module without importing it (the
    comparison reads .venv-client's copy, the one the session tests drive)."""
    assert CLIENT_PROTOCOL_DIR is not None
    source = (CLIENT_PROTOCOL_DIR / name).read_text()
    match = re.search(r"AddSerializedFile\((b'.*?')\)", source, re.S)
    assert match, f"no serialized descriptor in {name}"
    return descriptor_pb2.FileDescriptorProto.FromString(ast.literal_eval(match.group(1)))


def _wire_facts(files: list[descriptor_pb2.FileDescriptorProto]) -> dict[str, object]:
    """Everything that decides the bytes on the wire, keyed by fully-qualified name."""
    facts: dict[str, object] = {}

    def add_enum(prefix: str, enum: descriptor_pb2.EnumDescriptorProto) -> None:
        facts[f"enum {prefix}.{enum.name}"] = sorted((v.name, v.number) for v in enum.value)

    def add_message(prefix: str, msg: descriptor_pb2.DescriptorProto) -> None:
        name = f"{prefix}.{msg.name}"
        facts[f"message {name}"] = sorted(
            (
                f.number, f.name, f.type, f.label, f.type_name, f.proto3_optional,
                msg.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None,
            )
            for f in msg.field
        )  # fmt: skip
        facts[f"map-entry {name}"] = msg.options.map_entry
        for nested in msg.nested_type:
            add_message(name, nested)
        for enum in msg.enum_type:
            add_enum(name, enum)

    for file in files:
        prefix = f".{file.package}"
        for enum in file.enum_type:
            add_enum(prefix, enum)
        for msg in file.message_type:
            add_message(prefix, msg)
        for service in file.service:
            facts[f"service {prefix}.{service.name}"] = sorted(
                (m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming)
                for m in service.method
            )
    return facts


def _our_descriptor(module: str) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    importlib.import_module(module).DESCRIPTOR.CopyToProto(proto)
    return proto


@pytest.mark.skipif(CLIENT_PROTOCOL_DIR is None, reason="no .venv-client (run: make client-venv)")
def test_wire_format_is_identical_to_the_official_python_client() -> None:
    theirs = _wire_facts(
        [_client_descriptor("definition_pb2.py"), _client_descriptor("service_pb2.py")]
    )
    ours = _wire_facts(
        [
            _our_descriptor("popmq.pb.rocketmq.v2.definition_pb2"),
            _our_descriptor("popmq.pb.rocketmq.v2.service_pb2"),
        ]
    )
    missing = sorted(set(theirs) - set(ours))
    extra = sorted(set(ours) - set(theirs))
    differing = sorted(key for key in set(theirs) & set(ours) if theirs[key] != ours[key])
    assert not missing and not extra and not differing, (missing, extra, differing)
    assert len(theirs) > 60  # the comparison really covered the protocol


def test_well_known_types_come_from_popmqs_pool() -> None:
    """Our messages live in popmq.pb.pool.POOL and only accept that pool's Timestamp and
    Duration: google.protobuf's classes raise TypeError when assigned into them."""
    from popmq.pb import pool
    from popmq.pb.rocketmq.v2 import service_pb2 as s

    response = s.ReceiveMessageResponse()
    response.delivery_timestamp.FromMilliseconds(1_700_000_000_123)
    assert type(response.delivery_timestamp) is pool.Timestamp
    assert s.ReceiveMessageResponse.DESCRIPTOR.file.pool is pool.POOL
    offenders = [
        str(path.relative_to(REPO_ROOT))
        for folder in ("broker", "proxy", "popmq")
        for path in (REPO_ROOT / folder).rglob("*.py")
        if "pb" not in path.relative_to(REPO_ROOT).parts[:2]
        and re.search(r"google\.protobuf(\.| import )(timestamp|duration)_pb2", path.read_text())
    ]
    assert not offenders, f"use popmq.pb.pool.Timestamp/Duration instead in: {offenders}"
