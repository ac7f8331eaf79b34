"""The proxy's gRPC server options: what the transport lets in."""

from __future__ import annotations

import grpc
import pytest
from popmq.proxy.server import grpc_options

INT32_MAX = 2**31 - 1  # gRPC channel arguments are C ints


def _limits(max_body_bytes: int) -> dict[str, int]:
    return {k: v for k, v in grpc_options(max_body_bytes) if k.endswith("message_length")}


def test_a_default_body_limit_takes_rocketmqs_batch_of_32_bodies() -> None:
    limits = _limits(4 * 1024 * 1024)
    assert set(limits.values()) == {32 * 4 * 1024 * 1024 + (2 << 20)}


@pytest.mark.parametrize("max_body_bytes", [64 * 1024 * 1024, 1024 * 1024 * 1024])
async def test_a_large_body_limit_still_starts_a_server(max_body_bytes: int) -> None:
    # 32 bodies of 64 MiB are past a C int: the proxy failed to start with an OverflowError
    # traceback ("value too large to convert to int") instead of serving at gRPC's maximum.
    limits = _limits(max_body_bytes)
    assert all(0 < v <= INT32_MAX for v in limits.values())
    assert all(v >= max_body_bytes for v in limits.values())  # one maximal body still fits
    server = grpc.aio.server(options=grpc_options(max_body_bytes))
    try:
        assert server.add_insecure_port("127.0.0.1:0") > 0
        await server.start()
    finally:
        await server.stop(None)


def test_the_operator_bounds_one_request() -> None:
    limits = {k: v for k, v in grpc_options(4 << 20, max_request_bytes=8 << 20)
              if k.endswith("message_length")}  # fmt: skip
    assert set(limits.values()) == {8 << 20}


async def test_a_request_past_the_operators_bound_is_refused_by_the_transport(
    make_cluster,
) -> None:
    # A request is decoded before it is authenticated: proxy.max_request_bytes bounds what one
    # call can make the proxy allocate (the default, RocketMQ's 130 MiB, grew its RSS ~340 MiB).
    from popmq.broker.contract.errors import Code
    from proxy_support import unique

    from popmq.pb.rocketmq.v2 import definition_pb2 as pb
    from popmq.pb.rocketmq.v2 import service_pb2 as s

    cluster = await make_cluster(brokers=1, **{"proxy.max_request_bytes": 1 << 20})
    topic = unique("t")
    assert (await cluster.send(topic, b"x" * 100_000)).status.code == Code.OK
    request = s.SendMessageRequest(
        messages=[pb.Message(topic=pb.Resource(name=topic), body=b"x" * (2 << 20))]
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await cluster.stub.SendMessage(request, metadata=cluster.metadata())
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
