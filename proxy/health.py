"""grpc's health service as the proxy serves it: grpcio-health-checking's asyncio servicer with
the protocol's List, which it leaves to the generated base class (that raises
NotImplementedError: UNIMPLEMENTED, with a traceback logged per call)."""

from __future__ import annotations

from typing import Any

from grpc_health.v1 import health, health_pb2


class ProxyHealth(health.aio.HealthServicer):
    def __init__(self) -> None:
        super().__init__()
        self._names: set[str] = {""}

    async def set(self, service: str, status: Any) -> None:
        self._names.add(service)
        await super().set(service, status)

    async def List(
        self, request: health_pb2.HealthListRequest, context: Any
    ) -> health_pb2.HealthListResponse:
        """Every service's status now (a non-atomic snapshot, as the protocol allows)."""
        answer = health_pb2.HealthListResponse()
        for name in sorted(self._names):
            check = await self.Check(health_pb2.HealthCheckRequest(service=name), context)
            answer.statuses[name].status = check.status
        return answer
