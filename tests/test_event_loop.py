"""server.event_loop: the loop `popmq serve/proxy/broker` and the bench floor run on."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import anyio
import grpc
import pytest
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from pydantic import ValidationError

from popmq.cli import build_parser
from popmq.cli.common import config_from_args
from popmq.config import load_config
from popmq.event_loop import resolve, run


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_each_choice_runs_on_its_loop() -> None:
    assert run(_loop_type(), "uvloop") is uvloop.Loop
    assert not issubclass(run(_loop_type(), "asyncio"), uvloop.Loop)
    assert resolve("auto") == "uvloop"  # a dependency, so installed


def test_an_unknown_loop_is_refused_before_the_coroutine_starts() -> None:
    main = _loop_type()
    with pytest.raises(ValueError, match="expected one of auto, asyncio, uvloop"):
        run(main, "trio")
    assert main.cr_frame is None  # closed, not left pending


def test_config_from_file_env_and_flag(tmp_path: Path) -> None:
    assert load_config(environ={}).server.event_loop == "auto"
    path = tmp_path / "popmq.yaml"
    path.write_text("server:\n  event_loop: asyncio\n")
    assert load_config(path, environ={}).server.event_loop == "asyncio"
    env = {"POPMQ_SERVER__EVENT_LOOP": "uvloop"}
    assert load_config(path, environ=env).server.event_loop == "uvloop"
    args = build_parser().parse_args(["--event-loop", "asyncio", "serve"])
    assert config_from_args(args, {}).server.event_loop == "asyncio"
    with pytest.raises(ValidationError):
        load_config(overrides={"server.event_loop": "trio"}, environ={})


async def _grpc_round_trip_and_thread_wakeups() -> str:
    """What the servers lean on: grpc.aio serving and stopping, AnyIO task groups, worker
    threads waking the loop (call_soon_threadsafe)."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        names: list[str] = []
        async with anyio.create_task_group() as group:
            for _ in range(4):
                group.start_soon(
                    anyio.to_thread.run_sync, lambda: names.append(threading.current_thread().name)
                )
        assert len(names) == 4
    finally:
        await server.stop(grace=1)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_grpc_aio_and_threads_work_and_stop_on_either_loop(choice: str) -> None:
    assert run(_grpc_round_trip_and_thread_wakeups(), choice) == "SERVING"
