"""`popmq health`: ask a proxy or broker's grpc.health.v1 service whether it serves.

Exit 0 when SERVING, 1 when it answers anything else, 2 when it cannot be reached: what
container health checks and probes want (deploy/compose.yaml uses it).
"""

from __future__ import annotations

import argparse
import json

from popmq.cli.failures import UserError

DEFAULT_ENDPOINT = "127.0.0.1:8081"


def register(subparsers: argparse._SubParsersAction) -> None:
    health = subparsers.add_parser(
        "health", help="check that a proxy or broker is serving (exit 0 when it is)",
        description="Call grpc.health.v1 Check on a popmq proxy or broker. Exit 0: SERVING, "
        "1: answered but not serving, 2: unreachable.",
    )  # fmt: skip
    health.add_argument("--endpoint", default=DEFAULT_ENDPOINT, help="HOST:PORT to check")
    health.add_argument("--service", default="", help="service name ('' = the whole server)")
    health.add_argument("--timeout", type=float, default=3.0, help="seconds to wait")
    health.add_argument("--json", action="store_true", help="print JSON instead of text")
    health.set_defaults(func=run)


def check(endpoint: str, service: str = "", timeout: float = 3.0) -> str:
    """The server's status name (SERVING, NOT_SERVING, ...); UserError when unreachable."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(endpoint) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return "SERVICE_UNKNOWN"
            raise UserError(f"cannot reach {endpoint}: {exc.code().name}") from None
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def run(args: argparse.Namespace) -> int:
    status = check(args.endpoint, args.service, args.timeout)
    if args.json:
        print(json.dumps({"endpoint": args.endpoint, "status": status}))
    else:
        print(f"{args.endpoint} {status}")
    return 0 if status == "SERVING" else 1
