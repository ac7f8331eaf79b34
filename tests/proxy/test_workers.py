"""`popmq proxy --workers N`: N processes behind one port (SO_REUSEPORT), one clean stop."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from support.official_clients import PopmqProcess, broker

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.pb.rocketmq.v2 import service_pb2_grpc

pytestmark = pytest.mark.subprocess  # starts popmq or another process

METADATA = (("x-mq-client-id", "workers-test"), ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "GRPC_V2"))  # fmt: skip


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_two_workers_share_one_port_and_stop_cleanly(tmp_path: Path) -> None:
    store = broker("broker-a", tmp_path / "broker-a")
    try:
        broker_port = store.wait_listening("broker")
        proxy = PopmqProcess(
            ["proxy", "--port", "0", "--workers", "2",
             "--broker", f"broker-a=127.0.0.1:{broker_port}"],
            tmp_path / "proxy.log",
        )  # fmt: skip
        try:
            port = proxy.wait_listening()
            workers = _children(proxy.process.pid)
            assert len(workers) == 2
            # Fresh connections land on either worker; every one is a whole proxy.
            for _ in range(6):
                with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                    stub = service_pb2_grpc.MessagingServiceStub(channel)
                    request = s.QueryRouteRequest(topic=pb.Resource(name="workers-topic"))
                    route = stub.QueryRoute(request, metadata=METADATA, timeout=10)
                    assert route.status.code == 20000
                    assert {q.broker.name for q in route.message_queues} == {"broker-a"}
        finally:
            assert proxy.stop() == 0
        assert all(not Path(f"/proc/{pid}").exists() for pid in workers)
    finally:
        store.stop()
