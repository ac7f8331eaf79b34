"""gRPC server reflection for the proxy and the broker, so grpcurl / grpcui can list and call
their services.

Our protocol types live in popmq's private DescriptorPool (popmq/pb/pool.py), while grpc's own
services (health, reflection) are in protobuf's default pool; the reflection service looks in
both, ours first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from popmq.pb.pool import POOL


class ChainedPools:
    """The lookups grpc_reflection makes, answered by the first pool that knows the name."""

    def __init__(self, *pools: descriptor_pool.DescriptorPool) -> None:
        self._pools = pools

    def _first(self, lookup: Callable[[descriptor_pool.DescriptorPool], Any], name: object) -> Any:
        for pool in self._pools:
            try:
                return lookup(pool)
            except KeyError:
                continue
        raise KeyError(name)

    def FindFileByName(self, name: str) -> Any:
        return self._first(lambda pool: pool.FindFileByName(name), name)

    def FindFileContainingSymbol(self, symbol: str) -> Any:
        return self._first(lambda pool: pool.FindFileContainingSymbol(symbol), symbol)

    def FindMessageTypeByName(self, name: str) -> Any:
        return self._first(lambda pool: pool.FindMessageTypeByName(name), name)

    def FindExtensionByNumber(self, message: Any, number: int) -> Any:
        return self._first(lambda pool: pool.FindExtensionByNumber(message, number), number)

    def FindAllExtensions(self, message: Any) -> Any:
        return self._first(lambda pool: pool.FindAllExtensions(message), message.full_name)


class _GenericOnly:
    """The server as generated registration code sees it, minus registered methods."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        pass  # served through the generic handler above


def enable_reflection(
    server: grpc.aio.Server, service_names: Iterable[str], *, registered: bool = True
) -> None:
    """Serve grpc.reflection.v1alpha.ServerReflection listing service_names (and itself).
    ``registered=False``: through the generic handler only (as add_tolerant's: a registered
    method costs every call the server accepts a little)."""
    names = [*service_names, reflection.SERVICE_NAME]
    pools = ChainedPools(POOL, descriptor_pool.Default())
    if registered:
        reflection.enable_server_reflection(names, server, pool=pools)
    else:  # what enable_server_reflection does for a grpc.aio server, minus registration
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
            reflection.aio.ReflectionServicer(names, pool=pools), _GenericOnly(server)
        )
