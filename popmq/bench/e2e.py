"""`popmq bench e2e`: send + receive + ack per second through one proxy, against direct calls.

Each mode does the same work: P producers send 1 KiB messages in batches while C consumers
receive (batch 32), then ack what they got, until every message is acked.

- ``direct``: the load generator calls in-process brokers (LocalBrokerPort) itself;
- ``proxy``:  the load generator talks apache.rocketmq.v2 over gRPC to a ``popmq serve``
  process (proxy + the same number of embedded brokers) -- what a RocketMQ client does; the
  console runs too (on a free port), and the measurement starts once it has started: its
  start-up (importing its web stack) is not serving;
- ``cluster``: the same gRPC load against one ``popmq proxy`` process in front of the same
  number of ``popmq broker`` processes (the Helm chart's topology); the server CPU is reported
  for the proxy and for the brokers separately, and messages a broker popped that no consumer
  got are counted ("popped but not delivered": ``_stall_check``);
  with ``--replicas N`` the same cluster runs again with every broker a replicated group of
  N nodes, once per ``--replication`` mode (sync, async or both, in that order; static roles:
  popmq.bench.groups; sync with ``--min-in-sync``, default N), and the ratio of each to the
  unreplicated cluster is printed;
- ``floor``:  the same gRPC load against a server that does no work (popmq.bench.floor):
  the ceiling of any Python grpc.aio proxy with this load generator on this machine.

With ``acl`` (the default) the proxy runs with an ACL (popmq.bench.acl) and every call is
signed, as issue 18 measures it: every feature on.

With ``transactions``, each mode also runs as ``<mode>-tx`` (after the plain run, on the same
server, on a topic of its own; direct mode on fresh brokers): every message is a transactional
one (a half send, then EndTransaction COMMIT, then receive + ack), and the plain run beside it
sends one message per request too (the official clients send one transactional message per
request), so the ``tx / plain`` ratio compares like with like.

The proxy overhead is direct msg/s divided by proxy msg/s. Each mode gets fresh brokers. The
load generator and the server run in separate processes in proxy mode (as in production), so
the machine's cores are shared differently: read the figures on an otherwise idle machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from popmq.bench import progress as live
from popmq.bench.acl import BenchAcl, write_bench_acl
from popmq.bench.process_stats import cpu_seconds
from popmq.bench.table_text import grid
from popmq.event_loop import EVENT_LOOP_ENV

TOPIC = "bench-e2e"
TX_TOPIC = "bench-e2e-tx"  # a TRANSACTION topic (a topic has one message type)
GROUP = "bench-e2e-group"
MODES = ("direct", "proxy", "cluster", "cluster-unary", "floor")
# cluster-unary: the cluster mode with the proxy's broker requests as one unary RPC each
# (broker_link.requests=unary), to compare with the multiplexed request link in one run.
CLUSTER_MODES = ("cluster", "cluster-unary")
DEFAULT_MODES = ("direct", "proxy")
INVISIBLE_MS = 60_000
POLL_MS = 1_000
# The stall check (cluster modes): once every message is sent, this many seconds without an
# ack make the bench ask the brokers how many messages are popped and not acked.
STALL_QUIET_S = 3.0


@dataclass
class _Progress:
    target: int
    sent: int = 0
    acked: int = 0
    receives: int = 0
    empty_receives: int = 0
    receive_timeouts: int = 0
    latencies_ms: list[float] = field(default_factory=list)  # born -> acked, sampled
    holding: int = 0  # received by the consumers, not acked yet
    dropped: int = 0  # received, then dropped at a receive timeout (back after invisible time)
    undelivered: int = 0  # the stall check's largest count of popped messages nobody holds
    done: asyncio.Event = field(default_factory=asyncio.Event)
    send_done_s: float = 0.0

    def add_acked(self, count: int) -> None:
        self.acked += count
        live.count(count)
        if self.acked >= self.target:
            self.done.set()


def _percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)]


def _cpu_s(pid: int | None = None) -> float:
    return cpu_seconds(pid)


def _batches(total: int, size: int, workers: int) -> list[list[int]]:
    """Split `total` messages into per-worker lists of batch sizes."""
    sizes = [size] * (total // size) + ([total % size] if total % size else [])
    return [sizes[i::workers] for i in range(workers)]


# -- direct mode -------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def _brokers(count: int, queues: int, root: Path) -> AsyncIterator[list[Any]]:
    from popmq.broker.core import Broker
    from popmq.broker.local import LocalBrokerPort
    from popmq.config import BrokerConfig

    async with contextlib.AsyncExitStack() as stack:
        ports = []
        for index in range(count):
            config = BrokerConfig(name=f"broker-{index}", data_dir=root / f"broker-{index}")
            broker = Broker(config)
            await broker.start()
            stack.push_async_callback(broker.aclose)
            port = LocalBrokerPort(broker)
            await port.create_topic(TOPIC, queues)
            await port.create_topic(TX_TOPIC, queues, "TRANSACTION")
            ports.append(port)
        yield ports


async def _run_direct(params: dict[str, Any], root: Path) -> dict[str, dict[str, Any]]:
    """Each variant (plain, transactional) on fresh brokers; figures by name suffix."""
    figures: dict[str, dict[str, Any]] = {}
    for tx in params["variants"]:
        what = "half send + commit" if tx else "send"
        suffix = "-tx" if tx else ""
        live.phase(f"{params['name']}{suffix}: {what} + receive + ack", total=params["messages"])
        variant_root = root / f"direct{suffix}"
        variant_root.mkdir()
        figures[suffix] = await _run_direct_once(params, variant_root, tx)
    return figures


async def _run_direct_once(params: dict[str, Any], root: Path, tx: bool) -> dict[str, Any]:
    from popmq.broker.contract.types import PROP_TRANSACTION, AckEntry, Message, PopRequest

    body = b"x" * params["body_bytes"]
    progress = _Progress(params["messages"])
    topic = TX_TOPIC if tx else TOPIC
    properties = {PROP_TRANSACTION: "1"} if tx else {}
    async with _brokers(params["brokers"], params["queues"], root) as ports:
        turn = itertools.count()

        async def produce(sizes: list[int]) -> None:
            for size in sizes:
                port = ports[next(turn) % len(ports)]
                now = int(time.time() * 1000)
                batch = [Message(topic, body, born_timestamp_ms=now, properties=dict(properties))
                         for _ in range(size)]  # fmt: skip
                results = await port.send(batch)
                for result in results if tx else ():
                    await port.end_transaction(topic, result.message_id, result.transaction_id,
                                               True)  # fmt: skip
                progress.sent += size

        async def consume(index: int) -> None:
            request = PopRequest(group=GROUP, topic=topic, max_messages=params["receive_batch"],
                                 invisible_time_ms=INVISIBLE_MS, poll_time_ms=POLL_MS)  # fmt: skip
            for round_ in itertools.count(index):
                port = ports[round_ % len(ports)]
                result = await port.pop(request)
                progress.receives += 1
                if not result.messages:
                    progress.empty_receives += 1
                    continue
                await port.ack(GROUP, topic, [AckEntry(m.receipt_handle) for m in result.messages])
                now = time.time() * 1000
                progress.latencies_ms.append(now - result.messages[0].message.born_timestamp_ms)
                progress.add_acked(len(result.messages))

        return await _drive(params, progress, produce, consume, server_pid=None)


# -- proxy mode --------------------------------------------------------------------------------
def _serve_command(params: dict[str, Any], root: Path) -> list[str]:
    """`popmq serve` (proxy mode) or the do-nothing floor server (floor mode)."""
    if params["mode"] == "floor":
        return [sys.executable, "-m", "popmq.bench.floor", "--port", "0",
                "--brokers", str(params["brokers"]),
                "--body-bytes", str(params["body_bytes"])]  # fmt: skip
    settings = [
        f"broker.topics.queue_count={params['queues']}",
        f"proxy.strategy={params['strategy']}",
        "proxy.min_long_polling_ms=1000",
    ]
    args = [sys.executable, "-m", "popmq", "serve", "--port", "0",
            "--brokers", str(params["brokers"]), "--data-dir", str(root / "data"),
            "--console-port", str(_free_port())]  # fmt: skip
    for setting in settings:
        args += ["--set", setting]
    return args + _acl_flags(params)


def _acl_flags(params: dict[str, Any]) -> list[str]:
    acl: BenchAcl | None = params.get("bench_acl")
    return ["--acl", str(acl.path)] if acl is not None else []


def _proxy_settings(params: dict[str, Any]) -> list[str]:
    settings = [f"proxy.strategy={params['strategy']}", "proxy.min_long_polling_ms=1000"]
    if params["mode"] == "cluster-unary":
        settings.append("proxy.broker_link.requests=unary")
    return [arg for setting in settings for arg in ("--set", setting)]


@contextlib.asynccontextmanager
async def _cluster_brokers(params: dict[str, Any], root: Path) -> AsyncIterator[list[int]]:
    """``popmq broker`` processes with the bench topic (each broker a replicated group of
    ``group_replicas`` nodes when ``group_replication`` is sync or async); yields their pids
    (followers' too) and fills params["broker_args"] with the proxy's ``--broker NAME=ADDRESS``
    flags (the leaders')."""
    from popmq.bench.groups import create_topic_in_sync, replicated_group
    from popmq.config import BrokerConfig

    pids: list[int] = []
    ports: list[Any] = []
    replicas, replication = params.get("group_replicas", 1), params.get("group_replication", "off")
    min_in_sync = params.get("group_min_in_sync")
    async with contextlib.AsyncExitStack() as stack:
        flags: list[str] = []
        for index in range(params["brokers"]):
            name = f"broker-{index}"
            config = BrokerConfig(name=name, data_dir=root / name)
            port = await stack.enter_async_context(
                replicated_group(config, replicas, replication, pids, min_in_sync)
            )
            await create_topic_in_sync(port, TOPIC, params["queues"])
            await port.create_topic(TX_TOPIC, params["queues"], "TRANSACTION")
            flags += ["--broker", f"{name}={port.address}"]
            ports.append(port)
        params["broker_args"] = flags
        params["broker_ports"] = ports  # the leaders, for the stall check
        yield pids


def _free_port() -> int:
    """A port for `popmq serve`'s console: its default (8080) is often taken on a shared
    machine, and the bench must see the console start to leave it out of the measurement."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _console_started(stdout: asyncio.StreamReader) -> None:
    """Wait until `popmq serve` has started its console (or said it did not): the console
    imports its web stack after the proxy listens, CPU that is start-up, not serving, and
    would otherwise fall in the measured window."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(30):
            while line := (await stdout.readline()).decode():
                if line.startswith("popmq console"):
                    return


@contextlib.asynccontextmanager
async def _serve(params: dict[str, Any], root: Path) -> AsyncIterator[tuple[str, int]]:
    """The server process of the mode, listening; yields (endpoint, pid)."""
    if params["mode"] in CLUSTER_MODES:
        args = [sys.executable, "-m", "popmq", "proxy", "--port", "0",
                *params["broker_args"], *_proxy_settings(params), *_acl_flags(params)]  # fmt: skip
        if params.get("proxy_workers", 1) > 1:
            args += ["--workers", str(params["proxy_workers"])]
    else:
        args = _serve_command(params, root)
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            while True:
                line = (await process.stdout.readline()).decode()
                if not line:
                    raise RuntimeError(f"{args[3]} exited before listening")
                if "proxy listening on" in line:
                    break
        port = int(line.rsplit(":", 1)[1])
        if params["mode"] == "proxy":
            await _console_started(process.stdout)
        yield f"127.0.0.1:{port}", process.pid
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(15):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


async def _run_proxy(params: dict[str, Any], root: Path) -> dict[str, Any]:
    import grpc

    from popmq.pb.rocketmq.v2 import definition_pb2 as pb
    from popmq.pb.rocketmq.v2 import service_pb2 as s
    from popmq.pb.rocketmq.v2 import service_pb2_grpc

    body = b"x" * params["body_bytes"]
    client_id = f"bench@{os.getpid()}"
    headers = (("x-mq-client-id", client_id), ("x-mq-language", "PYTHON"),
               ("x-mq-protocol", "GRPC_V2"))  # fmt: skip
    acl: BenchAcl | None = None
    if params["acl"]:
        # The proxy checks it; the floor gets the same signed headers and ignores them.
        acl = write_bench_acl(root, [TOPIC, TX_TOPIC], GROUP)
        if params["mode"] != "floor":
            params = {**params, "bench_acl": acl}

    def meta() -> tuple[tuple[str, str], ...]:
        return headers + acl.metadata() if acl is not None else headers

    async with contextlib.AsyncExitStack() as stack:
        broker_pids: list[int] = []
        if params["mode"] in CLUSTER_MODES:
            broker_pids = await stack.enter_async_context(_cluster_brokers(params, root))
        endpoint, pid = await stack.enter_async_context(_serve(params, root))
        # A few connections, as several client processes would open.
        channels = [grpc.aio.insecure_channel(endpoint) for _ in range(params["channels"])]
        stubs = [service_pb2_grpc.MessagingServiceStub(c) for c in channels]
        try:

            async def one(tx: bool) -> dict[str, Any]:
                progress = _Progress(params["messages"])
                message_type = pb.TRANSACTION if tx else pb.NORMAL
                topic = pb.Resource(name=TX_TOPIC if tx else TOPIC)
                route = await stubs[0].QueryRoute(s.QueryRouteRequest(topic=topic), metadata=meta())
                if route.status.code != 20000:
                    raise RuntimeError(f"route failed: {route.status}")
                brokers = sorted({q.broker.name for q in route.message_queues})

                async def produce(index: int, sizes: list[int]) -> None:
                    stub = stubs[index % len(stubs)]
                    for size in sizes:
                        born = pb.SystemProperties(
                            body_encoding=pb.IDENTITY, message_type=message_type
                        )
                        born.born_timestamp.GetCurrentTime()
                        messages = []
                        for _ in range(size):
                            props = pb.SystemProperties()
                            props.CopyFrom(born)
                            props.message_id = uuid.uuid4().hex
                            messages.append(
                                pb.Message(topic=topic, body=body, system_properties=props)
                            )
                        response = await stub.SendMessage(
                            s.SendMessageRequest(messages=messages), metadata=meta()
                        )
                        if response.status.code != 20000:
                            raise RuntimeError(f"send failed: {response.status}")
                        for entry in response.entries if tx else ():
                            ended = await stub.EndTransaction(s.EndTransactionRequest(
                                topic=topic, message_id=entry.message_id,
                                transaction_id=entry.transaction_id, resolution=pb.COMMIT,
                                source=pb.SOURCE_CLIENT,
                            ), metadata=meta())  # fmt: skip
                            if ended.status.code != 20000:
                                raise RuntimeError(f"commit failed: {ended.status}")
                        progress.sent += size

                async def consume(index: int) -> None:
                    stub = stubs[index % len(stubs)]
                    group = pb.Resource(name=GROUP)
                    for round_ in itertools.count(index):
                        request = s.ReceiveMessageRequest(
                            group=group,
                            message_queue=pb.MessageQueue(
                                topic=topic, broker=pb.Broker(name=brokers[round_ % len(brokers)])
                            ),
                            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
                            batch_size=params["receive_batch"],
                        )
                        request.invisible_duration.FromMilliseconds(INVISIBLE_MS)
                        request.long_polling_timeout.FromMilliseconds(POLL_MS)
                        entries: list[s.AckMessageEntry] = []
                        first_born = 0.0
                        try:
                            async for frame in stub.ReceiveMessage(
                                request, metadata=meta(), timeout=10
                            ):
                                if frame.WhichOneof("content") == "message":
                                    props = frame.message.system_properties
                                    if not entries:
                                        first_born = props.born_timestamp.ToMilliseconds()
                                    entries.append(s.AckMessageEntry(
                                        message_id=props.message_id,
                                        receipt_handle=props.receipt_handle,
                                    ))  # fmt: skip
                        except grpc.aio.AioRpcError as error:
                            # A machine too loaded to answer within 10 s: what was received
                            # comes back after its invisible time; count it, go on.
                            if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                                raise
                            progress.receive_timeouts += 1
                            progress.dropped += len(entries)
                            entries = []
                        progress.receives += 1
                        if not entries:
                            progress.empty_receives += 1
                            continue
                        progress.holding += len(entries)
                        try:
                            acked = await stub.AckMessage(
                                s.AckMessageRequest(group=group, topic=topic, entries=entries),
                                metadata=meta(),
                            )
                        finally:
                            progress.holding -= len(entries)
                        if acked.status.code != 20000:
                            raise RuntimeError(f"ack failed: {acked.status}")
                        progress.latencies_ms.append(time.time() * 1000 - first_born)
                        progress.add_acked(len(entries))

                producer_ids = itertools.count()

                def produce_all(sizes: list[int]) -> Any:
                    return produce(next(producer_ids), sizes)

                watch = None
                if params.get("broker_ports"):
                    watch = functools.partial(
                        _stall_check, params["broker_ports"], topic.name, progress
                    )
                return await _drive(
                    params, progress, produce_all, consume, server_pid=pid,
                    broker_pids=broker_pids, watch=watch,
                )  # fmt: skip

            figures: dict[str, dict[str, Any]] = {}
            for tx in params["variants"]:
                what = "half send + commit" if tx else "send"
                live.phase(f"{params['name']}{'-tx' if tx else ''}: {what} + receive + ack",
                           total=params["messages"])  # fmt: skip
                figures["-tx" if tx else ""] = await one(tx)
            return figures
        finally:
            for channel in channels:
                await channel.close()


async def _stall_check(ports: Sequence[Any], topic: str, progress: _Progress) -> None:
    """Messages a broker popped that no consumer got (a pop's answer lost between the broker
    and the client): once everything is sent, a run that acks nothing for STALL_QUIET_S asks
    the brokers how many messages are popped and not acked; those the consumers neither hold
    nor dropped at a receive timeout are counted (``undelivered``). Such a message is invisible
    until its invisible time (60 s) ends: without this check it shows only as a slow run."""
    loop = asyncio.get_running_loop()
    acked, quiet_since = progress.acked, loop.time()
    while True:
        await asyncio.sleep(STALL_QUIET_S / 3)
        now = loop.time()
        if progress.acked != acked or progress.sent < progress.target:
            acked, quiet_since = progress.acked, now
            continue
        if now - quiet_since < STALL_QUIET_S:
            continue
        try:
            inflight = 0
            for port in ports:
                inflight += sum(queue.inflight for queue in await port.group_stats(GROUP, topic))
        except Exception:  # a check, not the load: a broker that does not answer is not counted
            continue
        if progress.acked == acked:  # still nothing acked: no answer was on its way
            undelivered = inflight - progress.holding - progress.dropped
            progress.undelivered = max(progress.undelivered, undelivered)


# -- shared driver -----------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _process_tree_cpu_s(pid: int) -> float:
    """CPU of a process and its children (``popmq proxy --workers N`` runs N workers)."""
    return _cpu_s(pid) + sum(_process_tree_cpu_s(child) for child in _children(pid))


async def _drive(
    params: dict[str, Any],
    progress: _Progress,
    produce: Any,
    consume: Any,
    server_pid: int | None,
    broker_pids: Sequence[int] = (),
    watch: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> dict[str, Any]:
    def each_broker_cpu() -> list[float]:
        return [_cpu_s(pid) for pid in broker_pids]

    def server_cpu() -> float:
        return _process_tree_cpu_s(server_pid) if server_pid else 0.0

    each_before = each_broker_cpu()
    cpu_before = (_cpu_s(), server_cpu(), sum(each_before))
    live.measure()  # the live rate is acked / this interval, as the table's msgs_per_s
    started = time.perf_counter()

    async def producers() -> None:
        plan = _batches(params["messages"], params["send_batch"], params["producers"])
        async with anyio.create_task_group() as group:
            for sizes in plan:
                group.start_soon(produce, sizes)
        progress.send_done_s = time.perf_counter() - started

    async with anyio.create_task_group() as group:
        group.start_soon(producers)
        async with anyio.create_task_group() as consumers:
            for i in range(params["consumers"]):
                consumers.start_soon(consume, i)
            if watch is not None:
                consumers.start_soon(watch)
            await progress.done.wait()
            consumers.cancel_scope.cancel()
    elapsed = time.perf_counter() - started
    live.measured()
    each_after = each_broker_cpu()
    cpu_after = (_cpu_s(), server_cpu(), sum(each_after))
    acked = max(progress.acked, 1)
    proxy_cpu = cpu_after[1] - cpu_before[1]
    broker_cpu = cpu_after[2] - cpu_before[2]
    # direct: the brokers run in the load generator; its CPU is the server's.
    server_total = proxy_cpu + broker_cpu if server_pid else cpu_after[0] - cpu_before[0]
    return {
        "msgs_per_s": round(progress.acked / elapsed),
        "elapsed_s": round(elapsed, 3),
        "send_msgs_per_s": round(params["messages"] / progress.send_done_s),
        "acked": progress.acked,
        "receives": progress.receives,
        "empty_receives": progress.empty_receives,
        "receive_timeouts": progress.receive_timeouts,
        # cluster modes: popped by a broker, received by no consumer (_stall_check)
        "undelivered": progress.undelivered,
        "latency_p50_ms": round(_percentile(progress.latencies_ms, 0.5), 1),
        "latency_p99_ms": round(_percentile(progress.latencies_ms, 0.99), 1),
        "cpu_s_load_generator": round(cpu_after[0] - cpu_before[0], 2),
        "cpu_s_server": round(proxy_cpu + broker_cpu, 2),
        # cluster: the proxy process (and its workers) and the broker processes apart.
        "cpu_s_proxy": round(proxy_cpu, 2),
        "cpu_s_brokers": round(broker_cpu, 2),
        "server_cpu_us_per_msg": round(server_total * 1e6 / acked),
        "proxy_cpu_us_per_msg": round(proxy_cpu * 1e6 / acked),
        "brokers_cpu_us_per_msg": round(broker_cpu * 1e6 / acked),
        # per broker process, in start order (a replicated group: its leader, then followers)
        "cpu_s_each_broker": [
            round(a - b, 2) for a, b in zip(each_after, each_before, strict=True)
        ],
    }


async def bench_e2e(
    messages: int = 50_000,
    body_bytes: int = 1024,
    producers: int = 8,
    consumers: int = 32,
    brokers: int = 3,
    queues: int = 8,
    send_batch: int = 16,
    receive_batch: int = 32,
    channels: int = 4,
    strategy: str = "adaptive",
    modes: Sequence[str] = DEFAULT_MODES,
    proxy_workers: int | Sequence[int] = 1,
    transactions: bool = False,
    acl: bool = True,
    replicas: int = 1,
    replication: str | Sequence[str] = "sync",
    min_in_sync: int | None = None,
) -> dict[str, Any]:
    """Run each mode on fresh brokers; return the JSON-serialisable figures."""
    workers = (proxy_workers,) if isinstance(proxy_workers, int) else tuple(proxy_workers)
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}: choose from {MODES}")
    if transactions:  # one message per send, as a transactional producer sends
        send_batch = 1
    replication_modes = [replication] if isinstance(replication, str) else list(replication)
    params = {
        "messages": messages, "body_bytes": body_bytes, "producers": producers,
        "consumers": consumers, "brokers": brokers, "queues": queues, "send_batch": send_batch,
        "receive_batch": receive_batch, "channels": channels, "strategy": strategy,
        "proxy_workers": list(workers), "transactions": transactions, "replicas": replicas,
        "replication": replication_modes, "min_in_sync": min_in_sync or replicas, "acl": acl,
        # The servers' loop (they and the floor inherit this environment): server.event_loop.
        "event_loop": os.environ.get(EVENT_LOOP_ENV, "auto"),
    }  # fmt: skip
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="popmq-bench-e2e-") as tmp:
        for mode in modes:
            run = _run_direct if mode == "direct" else _run_proxy
            # cluster runs once per worker count: "cluster" (N=1), "cluster-w2", ...
            counts = workers if mode == "cluster" else (1,)
            for count in counts:
                base = mode if count == 1 else f"{mode}-w{count}"
                # --replicas N: the unreplicated cluster, then each broker a group of N nodes.
                groups = [("off", 1)]
                if mode == "cluster" and replicas > 1:
                    groups += [(each, replicas) for each in replication_modes]
                for group_mode, group_size in groups:
                    name = (base if group_size == 1
                            else _replicated_name(base, group_mode, params))  # fmt: skip
                    root = Path(tmp) / name
                    root.mkdir()
                    # With transactions, the transactional run follows the plain one on the
                    # same server (brokers and proxy), on a topic of its own.
                    run_params = {**params, "mode": mode, "proxy_workers": count, "name": name,
                                  "variants": (False, True) if transactions and mode != "floor"
                                  else (False,), "group_replicas": group_size,
                                  "group_replication": group_mode,
                                  "group_min_in_sync": params["min_in_sync"]}  # fmt: skip
                    for suffix, figures in (await run(run_params, root)).items():
                        results[name + suffix] = figures
    result: dict[str, Any] = {"params": params, "results": results}
    if "direct" in results and "proxy" in results:
        result["proxy_overhead"] = round(
            results["direct"]["msgs_per_s"] / max(results["proxy"]["msgs_per_s"], 1), 2
        )
    for each in replication_modes:
        replicated = _replicated_name("cluster", each, params)
        if replicated in results and "cluster" in results:
            # What replication costs, same run (issue 19's goal for sync with 3 nodes: >= 0.6).
            result.setdefault("replicated_over_cluster", {})[replicated] = {
                "msgs_per_s": round(
                    results[replicated]["msgs_per_s"] / max(results["cluster"]["msgs_per_s"], 1),
                    2,
                ),
                "send_msgs_per_s": round(
                    results[replicated]["send_msgs_per_s"]
                    / max(results["cluster"]["send_msgs_per_s"], 1), 2
                ),
            }  # fmt: skip
    if "floor" in results and "proxy" in results:
        # How far the proxy is from what gRPC alone allows (1.0: the proxy costs nothing).
        result["floor_over_proxy"] = round(
            results["floor"]["msgs_per_s"] / max(results["proxy"]["msgs_per_s"], 1), 2
        )
    if "cluster" in results and "proxy" in results:
        # The production topology against the embedded one (goal: >= 0.7).
        result["cluster_over_proxy"] = round(
            results["cluster"]["msgs_per_s"] / max(results["proxy"]["msgs_per_s"], 1), 2
        )
    if "cluster" in results and "cluster-unary" in results:
        # The multiplexed request link against one unary RPC per request.
        stream, unary = results["cluster"], results["cluster-unary"]
        result["stream_over_unary"] = {
            "msgs_per_s": round(stream["msgs_per_s"] / max(unary["msgs_per_s"], 1), 2),
            "proxy_cpu_us_per_msg": round(
                stream["proxy_cpu_us_per_msg"] / max(unary["proxy_cpu_us_per_msg"], 1), 2
            ),
            "brokers_cpu_us_per_msg": round(
                stream["brokers_cpu_us_per_msg"] / max(unary["brokers_cpu_us_per_msg"], 1), 2
            ),
        }
    for name, figures in results.items():
        if name.startswith("cluster-w") and "cluster" in results:
            # --workers N against one worker: msg/s and server CPU per message.
            base = results["cluster"]
            result[f"{name}_over_cluster"] = {
                "msgs_per_s": round(figures["msgs_per_s"] / max(base["msgs_per_s"], 1), 2),
                "proxy_cpu_us_per_msg": round(
                    figures["proxy_cpu_us_per_msg"] / max(base["proxy_cpu_us_per_msg"], 1), 2
                ),
            }
    tx_ratios = {}
    for name, figures in results.items():
        plain = results.get(name.removesuffix("-tx"))
        if name.endswith("-tx") and plain is not None:
            tx_ratios[name.removesuffix("-tx")] = {
                "msgs_per_s": round(figures["msgs_per_s"] / max(plain["msgs_per_s"], 1), 2),
                "server_cpu_us_per_msg": round(
                    figures["server_cpu_us_per_msg"] / max(plain["server_cpu_us_per_msg"], 1), 2
                ),
            }
    if tx_ratios:
        result["tx_over_plain"] = tx_ratios
    if "floor" in results and "proxy" in results:
        result["proxy_over_floor"] = round(
            results["proxy"]["msgs_per_s"] / max(results["floor"]["msgs_per_s"], 1), 2
        )
        # Issue 18's second target: the proxy's server CPU per message against the floor's.
        result["proxy_cpu_over_floor"] = round(
            results["proxy"]["server_cpu_us_per_msg"]
            / max(results["floor"]["server_cpu_us_per_msg"], 1),
            2,
        )
    return result


def _replicated_name(name: str, mode: str, params: dict[str, Any]) -> str:
    return f"{name}-{mode}-r{params['replicas']}"


def format_table(result: dict[str, Any]) -> str:
    p = result["params"]
    tx_note = "; transactional runs (-tx): half send + commit" if p.get("transactions") else ""
    lines = [
        f"{p['messages']} messages x {p['body_bytes']} B; {p['producers']} producers "
        f"(batches of {p['send_batch']}), {p['consumers']} consumers (receive {p['receive_batch']}"
        f" + ack); {p['brokers']} brokers x {p['queues']} queues; strategy {p['strategy']}; "
        f"ACL {'on (signed calls)' if p.get('acl') else 'off'}{tx_note}",
        "",
    ]
    header = ["mode", "e2e msg/s", "send msg/s", "p50 ms", "p99 ms", "receives", "empty",
              "CPU s (gen)", "CPU s (server)", "µs/msg server", "µs/msg proxy",
              "µs/msg brokers"]  # fmt: skip
    rows = [header]
    for mode, r in result["results"].items():
        rows.append([mode, str(r["msgs_per_s"]), str(r["send_msgs_per_s"]),
                     str(r["latency_p50_ms"]), str(r["latency_p99_ms"]), str(r["receives"]),
                     str(r["empty_receives"]), str(r["cpu_s_load_generator"]),
                     str(r["cpu_s_server"]), str(r["server_cpu_us_per_msg"]),
                     str(r["proxy_cpu_us_per_msg"]) if mode.startswith("cluster") else "-",
                     str(r["brokers_cpu_us_per_msg"]) if mode.startswith("cluster") else "-",
                     ])  # fmt: skip
    lines += grid(rows)
    undelivered = [f"{mode} {r['undelivered']}" for mode, r in result["results"].items()
                   if "undelivered" in r and mode.startswith("cluster")]  # fmt: skip
    if undelivered:  # a lost pop answer: the stall check (_stall_check)
        lines += ["", f"popped but not delivered: {', '.join(undelivered)}"]
    if "proxy_overhead" in result:
        lines += ["", f"proxy overhead (direct / proxy msg/s): {result['proxy_overhead']}x"]
    if "floor_over_proxy" in result:
        lines += [f"gRPC floor / proxy msg/s: {result['floor_over_proxy']}x"]
    if "proxy_over_floor" in result:
        lines += [f"proxy / floor msg/s: {result['proxy_over_floor']} (goal >= 0.6)"]
    if "proxy_cpu_over_floor" in result:
        lines += [f"proxy / floor server CPU µs/msg: {result['proxy_cpu_over_floor']} (goal <= 2)"]
    if "cluster_over_proxy" in result:
        lines += [f"cluster / proxy msg/s: {result['cluster_over_proxy']} (goal >= 0.7)"]
    if "stream_over_unary" in result:
        ratio = result["stream_over_unary"]
        lines += [
            f"request link stream / unary: msg/s {ratio['msgs_per_s']}x, proxy CPU µs/msg "
            f"{ratio['proxy_cpu_us_per_msg']}x, brokers CPU µs/msg "
            f"{ratio['brokers_cpu_us_per_msg']}x"
        ]
    for name, ratio in result.get("tx_over_plain", {}).items():
        lines += [
            f"{name}: transactional / plain: msg/s {ratio['msgs_per_s']}x, server CPU µs/msg "
            f"{ratio['server_cpu_us_per_msg']}x"
        ]
    for name, ratio in result.get("replicated_over_cluster", {}).items():
        goal = " (goal >= 0.6)" if "-sync-" in name else ""
        lines += [
            f"{name} / cluster: e2e msg/s {ratio['msgs_per_s']}{goal}, send msg/s "
            f"{ratio['send_msgs_per_s']}"
        ]
    if result.get("replicated_over_cluster"):
        lines += [f"replicated groups: {p['replicas']} nodes, sync with --min-in-sync "
                  f"{p['min_in_sync']}"]  # fmt: skip
    for key, ratio in result.items():
        if key.startswith("cluster-w") and key.endswith("_over_cluster"):
            name = key.removesuffix("_over_cluster")
            lines += [
                f"{name} / cluster: msg/s {ratio['msgs_per_s']}x, proxy CPU µs/msg "
                f"{ratio['proxy_cpu_us_per_msg']}x"
            ]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m popmq.bench.e2e [messages]
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    print(format_table(asyncio.run(bench_e2e(messages=count))))
