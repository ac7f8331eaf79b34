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
