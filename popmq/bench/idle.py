"""`popmq bench idle`: what thousands of concurrent idle long polls cost, per strategy.

B ``popmq broker`` processes are started once; for each strategy a fresh ``popmq proxy``
process (cluster mode, so the proxy's memory and CPU are its own) fronts them. The load
generator opens a few gRPC connections and keeps ``long_polls`` ReceiveMessage calls waiting
on an empty topic: each poller loops ``receive`` with ``awaitDuration = await_ms``; the
pollers start spread over ``ramp_s`` (one awaitDuration) so their polls do not end together,
and they use the route's queues in turn (so ``pop`` binds them evenly to the brokers). Once
every poller is waiting, it measures the steady state for ``duration_s``:

- the proxy's RSS (psutil) before any long poll and at most while they wait;
- broker RPCs per second, from the proxy's ``popmq_proxy_broker_rpcs_total`` (by kind);
- requests held on the brokers (``popmq_broker_held_requests`` by kind, mean of samples)
  and the proxy's held notifications;
- CPU seconds of the proxy and of the brokers over the window.

Nothing is sent, so every answer is empty; a message received would be a bug (counted).

With ``acl`` (the default) the proxy runs with an ACL (popmq.bench.acl) and the pollers sign
every call, as the official clients do; the floor gets the same signed calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from prometheus_client.parser import text_string_to_metric_families

from popmq.bench import progress as live
from popmq.bench.acl import BenchAcl, write_bench_acl
from popmq.bench.brokers import process_cpu_s
from popmq.bench.process_stats import rss_mib
from popmq.bench.table_text import grid
from popmq.lifecycle import fan_out

TOPIC = "bench-idle"
GROUP = "bench-idle-group"
QUEUES_PER_BROKER = 4
STRATEGIES = ("pop", "slices", "notify", "adaptive", "floor")
RAM_DISK = "/dev/shm"
START_TIMEOUT_S = 60.0

_BROKER_UP = re.compile(r"popmq broker \S+ listening on (\S+)")
_PROXY_UP = re.compile(r"popmq proxy listening on (\S+)")
_FLOOR_UP = re.compile(r"popmq floor proxy listening on (\S+)")
_METRICS_UP = re.compile(r"popmq metrics on (\S+)")

Samples = list[tuple[str, dict[str, str], float]]


# -- processes -----------------------------------------------------------------------------------
@dataclass
class _Child:
    process: asyncio.subprocess.Process
    log_path: Path
    lines: dict[str, str] = field(default_factory=dict)  # pattern -> first match

    @property
    def pid(self) -> int:
        return self.process.pid

    async def await_lines(self, patterns: Mapping[str, re.Pattern[str]]) -> None:
        """Read stdout until every pattern has matched once."""
        assert self.process.stdout is not None
        async with asyncio.timeout(START_TIMEOUT_S):
            while len(self.lines) < len(patterns):
                raw = await self.process.stdout.readline()
                if not raw:
                    tail = self.log_path.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{self.log_path.stem} exited before starting: {tail}")
                for key, pattern in patterns.items():
                    match = pattern.search(raw.decode(errors="replace"))
                    if match and key not in self.lines:
                        self.lines[key] = match.group(1)

    async def stop(self) -> None:
        if self.process.returncode is not None:
            return
        self.process.terminate()
        try:
            async with asyncio.timeout(15):
                await self.process.wait()
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


@contextlib.asynccontextmanager
async def _child(args: list[str], log_path: Path, module: bool = False) -> AsyncIterator[_Child]:
    """``popmq ARGS`` (or, with ``module``, the command ARGS as given) as a child process."""
    command = args if module else [sys.executable, "-m", "popmq", *args]
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdout=asyncio.subprocess.PIPE, stderr=log, stdin=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
    child = _Child(process, log_path)
    try:
        yield child
    finally:
        await child.stop()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _set_flags(settings: Mapping[str, Any]) -> list[str]:
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]


@dataclass
class _Brokers:
    names: list[str]
    addresses: list[str]
    metrics: list[str]
    pids: list[int]


@contextlib.asynccontextmanager
async def _brokers(count: int, root: Path, settings: Mapping[str, Any]) -> AsyncIterator[_Brokers]:
    """``count`` broker processes, started side by side, with the topic on each."""
    from popmq.broker.wire.remote import RemoteBrokerPort

    async with contextlib.AsyncExitStack() as stack:
        names = [f"broker-{i}" for i in range(count)]
        metrics = [f"127.0.0.1:{_free_port()}" for _ in names]
        children = []
        for name, address in zip(names, metrics, strict=True):
            args = ["broker", "--name", name, "--host", "127.0.0.1", "--port", "0",
                    "--data-dir", str(root / name), "--metrics-port", address.split(":")[1],
                    *_set_flags(settings)]  # fmt: skip
            children.append(await stack.enter_async_context(_child(args, root / f"{name}.log")))
        await fan_out(c.await_lines({"address": _BROKER_UP}) for c in children)
        addresses = [c.lines["address"] for c in children]
        for name, address in zip(names, addresses, strict=True):
            port = RemoteBrokerPort(name, address)
            try:
                await port.create_topic(TOPIC, QUEUES_PER_BROKER)
            finally:
                await port.aclose()
        yield _Brokers(names, addresses, metrics, [c.pid for c in children])


@contextlib.asynccontextmanager
async def _proxy(
    strategy: str,
    brokers: _Brokers,
    root: Path,
    settings: Mapping[str, Any],
    acl: BenchAcl | None = None,
) -> AsyncIterator[_Child]:
    args = ["proxy", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
            "--strategy", strategy, *_set_flags(settings)]  # fmt: skip
    if acl is not None:
        args += ["--acl", str(acl.path)]
    for name, address in zip(brokers.names, brokers.addresses, strict=True):
        args += ["--broker", f"{name}={address}"]
    if strategy == "floor":
        # The do-nothing grpc.aio server (popmq.bench.floor) holding the same receives: the
        # CPU any Python proxy needs for this many streaming calls per second.
        args = [sys.executable, "-m", "popmq.bench.floor", "--port", "0",
                "--brokers", str(len(brokers.names))]  # fmt: skip
        async with _child(args, root / "floor.log", module=True) as child:
            await child.await_lines({"address": _FLOOR_UP})
            yield child
        return
    async with _child(args, root / f"proxy-{strategy}.log") as child:
        await child.await_lines({"metrics": _METRICS_UP, "address": _PROXY_UP})
        yield child


# -- measuring -----------------------------------------------------------------------------------
def _rss_mib(pid: int) -> float:
    return rss_mib(pid)


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def _scrape_now(address: str) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


async def _scrape(address: str) -> Samples:
    return await asyncio.to_thread(_scrape_now, address)


def _total(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        value
        for sample_name, sample_labels, value in samples
        if sample_name == name and all(sample_labels.get(k) == v for k, v in labels.items())
    )


def _by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for sample_name, labels, value in samples:
        if sample_name == name and label in labels:
            out[labels[label]] = out.get(labels[label], 0.0) + value
    return out


async def _broker_held(brokers: _Brokers) -> dict[str, float]:
    held: dict[str, float] = {}
    for address in brokers.metrics:
        for kind, value in _by_label(
            await _scrape(address), "popmq_broker_held_requests", "kind"
        ).items():
            held[kind] = held.get(kind, 0.0) + value
    return held


# -- the idle pollers ----------------------------------------------------------------------------
@dataclass
class _Pollers:
    started: int = 0
    receives: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)  # "CODE: detail" -> count
    unexpected_messages: int = 0

    def note_error(self, error: Exception) -> None:
        self.errors += 1
        text = str(error)
        kind = f"{getattr(error, 'code', type(error).__name__)}: {text.split(': ', 1)[-1][:80]}"
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


async def _poll_forever(
    client: Any, queue: Any, delay_s: float, await_ms: int, stats: _Pollers
) -> None:
    from popmq.client.errors import ProxyError, ProxyUnavailable

    await asyncio.sleep(delay_s)
    stats.started += 1
    while True:
        try:
            got = await client.receive(
                GROUP, queue, batch_size=32, invisible_ms=60_000, long_polling_ms=await_ms
            )
        except (ProxyError, ProxyUnavailable) as error:
            stats.note_error(error)
            await asyncio.sleep(0.5)  # as a client backs off before polling again
            continue
        stats.receives += 1
        stats.unexpected_messages += len(got)


async def _wait_for(condition: Any, limit_s: float, what: str) -> None:
    try:
        async with asyncio.timeout(limit_s):
            while not await condition():  # noqa: ASYNC110 (a scrape, not an event)
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise RuntimeError(f"timed out after {limit_s} s waiting for {what}") from None


async def _run_strategy(
    strategy: str, brokers: _Brokers, root: Path, params: dict[str, Any]
) -> dict[str, Any]:
    from popmq.client.aio import AsyncClient
    from popmq.client.security import ClientSecurity

    long_polls: int = params["long_polls"]
    acl = write_bench_acl(root, TOPIC, GROUP) if params["acl"] else None
    security = ClientSecurity(acl.access_key, acl.secret_key) if acl is not None else None
    async with _proxy(strategy, brokers, root, params["proxy_settings"], acl) as proxy:
        metrics = proxy.lines.get("metrics")
        await asyncio.sleep(0.5)  # let the fresh process settle before its base RSS
        rss_base = _rss_mib(proxy.pid)
        stats = _Pollers()
        clients = [AsyncClient(proxy.lines["address"], timeout_s=30.0, security=security)
                   for _ in range(params["channels"])]  # fmt: skip
        try:
            route = await clients[0].query_route(TOPIC)
            ramp_s: float = params["ramp_s"]
            async with anyio.create_task_group() as pollers:
                for i in range(long_polls):
                    client, queue = clients[i % len(clients)], route[i % len(route)]
                    delay_s = ramp_s * i / long_polls
                    pollers.start_soon(
                        _poll_forever, client, queue, delay_s, params["await_ms"], stats
                    )

                async def all_waiting() -> bool:
                    if stats.started < long_polls:
                        return False
                    if metrics is None:  # the floor counts nothing: every poller started
                        return True
                    samples = await _scrape(metrics)
                    return _total(samples, "popmq_proxy_long_polls_total") >= long_polls

                await _wait_for(all_waiting, ramp_s + START_TIMEOUT_S, "every long poll")
                await asyncio.sleep(params["settle_s"])
                figures = await _measure(proxy, brokers, params, stats, rss_base)
                pollers.cancel_scope.cancel()
        finally:
            for client in clients:
                await client.close()

    # The proxy is gone: the brokers must drop everything it held before the next run.
    async def brokers_idle() -> bool:
        return sum((await _broker_held(brokers)).values()) == 0

    await _wait_for(brokers_idle, 15.0, "the brokers to release held requests")
    return {"strategy": strategy, **figures}


async def _measure(
    proxy: _Child, brokers: _Brokers, params: dict[str, Any], stats: _Pollers, rss_base: float
) -> dict[str, Any]:
    metrics = proxy.lines.get("metrics")

    async def scrape() -> Samples:
        return await _scrape(metrics) if metrics is not None else []

    duration_s: float = params["duration_s"]
    step_s = min(1.0, duration_s / 5)
    before = await scrape()
    cpu_before = (process_cpu_s(proxy.pid), sum(process_cpu_s(p) for p in brokers.pids),
                  _own_cpu_s())  # fmt: skip
    receives_before, errors_before = stats.receives, stats.errors
    started = time.perf_counter()
    rss: list[float] = []
    held_proxy: list[float] = []
    held_brokers: list[dict[str, float]] = []
    while True:
        rss.append(_rss_mib(proxy.pid))
        held_proxy.append(_total(await scrape(), "popmq_proxy_held_notification_tasks"))
        held_brokers.append(await _broker_held(brokers))
        left = duration_s - (time.perf_counter() - started)
        if left <= 0:
            break
        await asyncio.sleep(min(step_s, left))
    window = time.perf_counter() - started
    after = await scrape()
    cpu_after = (process_cpu_s(proxy.pid), sum(process_cpu_s(p) for p in brokers.pids),
                 _own_cpu_s())  # fmt: skip
    rss.append(_rss_mib(proxy.pid))
    rpcs_name = "popmq_proxy_broker_rpcs_total"
    rpcs = _by_label(after, rpcs_name, "kind")
    for kind, value in _by_label(before, rpcs_name, "kind").items():
        rpcs[kind] = rpcs.get(kind, 0.0) - value
    kinds = sorted({kind for sample in held_brokers for kind in sample})
    modes = _by_label(after, "popmq_proxy_adaptive_mode", "mode")
    long_polls: int = params["long_polls"]
    return {
        "long_polls": long_polls,
        "window_s": round(window, 2),
        "receives_per_s": round((stats.receives - receives_before) / window, 1),
        "broker_rpcs_per_s": round(sum(rpcs.values()) / window, 1),
        "broker_rpcs_per_s_by_kind": {k: round(v / window, 1) for k, v in sorted(rpcs.items())},
        "held_on_brokers": {
            kind: round(sum(s.get(kind, 0.0) for s in held_brokers) / len(held_brokers), 1)
            for kind in kinds
        },
        # The most seen at one sample: what a loaded machine's late pollers cannot pull down.
        "held_on_brokers_max": {
            kind: max(s.get(kind, 0.0) for s in held_brokers) for kind in kinds
        },
        "proxy_held_notifications": round(sum(held_proxy) / len(held_proxy), 1),
        "proxy_rss_mib": {"base": round(rss_base, 1), "max": round(max(rss), 1)},
        "rss_kib_per_long_poll": round((max(rss) - rss_base) * 1024 / long_polls, 1),
        # Of one core, over the window (goal for notify: <= 30%; print the floor beside it).
        "proxy_cpu_pct_of_core": round(100 * (cpu_after[0] - cpu_before[0]) / window, 1),
        "cpu_s": {
            "proxy": round(cpu_after[0] - cpu_before[0], 2),
            "brokers": round(cpu_after[1] - cpu_before[1], 2),
            "load_generator": round(cpu_after[2] - cpu_before[2], 2),
        },
        "adaptive_mode": max(modes, key=lambda m: modes[m]) if any(modes.values()) else None,
        "client_errors": stats.errors - errors_before,
        "client_error_kinds": dict(stats.error_kinds),
        "unexpected_messages": stats.unexpected_messages,
    }


def _ram_disk() -> str | None:
    return RAM_DISK if os.path.isdir(RAM_DISK) else None


# -- entry points --------------------------------------------------------------------------------
async def bench_idle(
    long_polls: int = 2000,
    brokers: int = 4,
    duration_s: float = 20.0,
    strategies: Sequence[str] = ("pop", "notify", "adaptive"),
    await_ms: int = 20_000,
    channels: int = 4,
    ramp_s: float | None = None,
    settle_s: float = 2.0,
    proxy_settings: Mapping[str, Any] | None = None,
    broker_settings: Mapping[str, Any] | None = None,
    data_dir: str | None = None,
    acl: bool = True,
) -> dict[str, Any]:
    """Run each strategy's proxy in front of the same brokers; return the figures.

    The pollers start evenly over ``ramp_s`` (default: one awaitDuration), so their polls end
    evenly too: the steady state of ``long_polls`` idle consumers, about
    ``long_polls / awaitDuration`` receives per second, is what is measured.
    ``proxy_settings`` / ``broker_settings`` are config overrides (``--set KEY=VALUE``), e.g.
    ``{"proxy.min_long_polling_ms": 1000}`` to poll shorter than the 5 s default minimum.
    """
    unknown = set(strategies) - set(STRATEGIES)
    if unknown:
        raise ValueError(f"unknown strategies {sorted(unknown)}: choose from {STRATEGIES}")
    params: dict[str, Any] = {
        "long_polls": long_polls, "brokers": brokers, "duration_s": duration_s,
        "await_ms": await_ms, "channels": channels, "settle_s": settle_s,
        "ramp_s": await_ms / 1000 if ramp_s is None else ramp_s,
        # The bench's long polls are all one group's: admission control's per-group and
        # per-client caps (2,000 / 1,000) would refuse most of them (TOO_MANY_REQUESTS), so
        # they are raised to the count measured; --proxy-set still wins.
        "proxy_settings": {
            "proxy.max_long_polls": max(long_polls, 10_000),
            "proxy.max_long_polls_per_group": max(long_polls, 2_000),
            "proxy.max_long_polls_per_client": max(long_polls, 1_000),
            # With the ACL all of them are one access key's calls (a real fleet has many
            # keys): its open-call cap (10,000) would refuse the last ones.
            "proxy.max_streams_per_access_key": max(2 * long_polls, 10_000),
            # ... and they share connections: past the per-connection stream cap (2,000) the
            # streams beyond it are reset. grpc pools subchannels across channels with the
            # same target and arguments, so the `channels` clients may share ONE connection:
            # the cap must cover every poll (3,000 polls on "4 channels" lost 2,288 receives).
            "proxy.max_streams_per_connection": max(2 * long_polls, 2_000),
            **(proxy_settings or {}),
        },
        "broker_settings": dict(broker_settings or {}), "cpus": os.cpu_count(), "acl": acl,
    }  # fmt: skip
    base = data_dir or _ram_disk()
    runs = []
    with tempfile.TemporaryDirectory(prefix="popmq-bench-idle-", dir=base) as tmp:
        root = Path(tmp)
        async with _brokers(brokers, root, params["broker_settings"]) as cluster:
            for strategy in strategies:
                live.phase(f"{strategy}: {params['long_polls']} idle long polls")
                runs.append(await _run_strategy(strategy, cluster, root, params))
    return {"params": params, "runs": runs}


def format_table(result: dict[str, Any]) -> str:
    p = result["params"]
    lines = [
        f"idle: {p['long_polls']} concurrent long polls on {p['channels']} client channels, "
        f"awaitDuration {p['await_ms']} ms, {p['brokers']} broker processes behind one "
        f"proxy process, {p['duration_s']} s measured per strategy; "
        f"ACL {'on (signed calls)' if p.get('acl') else 'off'}",
        "",
    ]
    header = ["strategy", "recv/s", "broker RPC/s", "probe/s", "held pop", "held notify",
              "proxy notif", "RSS base MiB", "RSS MiB", "KiB/poll", "CPU s proxy",
              "proxy % core", "CPU s brokers", "mode", "errors"]  # fmt: skip
    rows = [header]
    for run in result["runs"]:
        held = run["held_on_brokers"]
        rows.append([
            run["strategy"], f"{run['receives_per_s']:.0f}", f"{run['broker_rpcs_per_s']:.0f}",
            f"{run['broker_rpcs_per_s_by_kind'].get('notify_probe', 0.0):.0f}",
            f"{held.get('pop', 0.0):.0f}", f"{held.get('notify', 0.0):.0f}",
            f"{run['proxy_held_notifications']:.0f}", f"{run['proxy_rss_mib']['base']:.0f}",
            f"{run['proxy_rss_mib']['max']:.0f}", f"{run['rss_kib_per_long_poll']:.1f}",
            f"{run['cpu_s']['proxy']:.2f}", f"{run['proxy_cpu_pct_of_core']:.0f}",
            f"{run['cpu_s']['brokers']:.2f}",
            run["adaptive_mode"] or "-", str(run["client_errors"]),
        ])  # fmt: skip
    lines += grid(rows)
    lines += [
        "broker RPC/s: every proxy -> broker call (probe/s: the false-empty probes among them);"
        " held: requests waiting on the brokers (mean); proxy notif: notifications the proxy"
        " holds; RSS: the proxy process before the long polls and at most with them; floor: a"
        " do-nothing grpc.aio server holding the same receives (popmq.bench.floor)",
    ]
    lines += against_floor(result["runs"])
    return "\n".join(lines)


def against_floor(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Each strategy against the floor, as issue 18's targets read: RSS <= the floor's + 50
    MiB, CPU <= 1.2x the floor's, 0 broker RPC/s, 0 errors."""
    floor = next((run for run in runs if run["strategy"] == "floor"), None)
    if floor is None:
        return []
    lines = []
    for run in runs:
        if run is floor:
            continue
        rss = run["proxy_rss_mib"]["max"] - floor["proxy_rss_mib"]["max"]
        cpu = run["cpu_s"]["proxy"] / max(floor["cpu_s"]["proxy"], 1e-9)
        # A loaded machine answers fewer receives a second than the polls ask: per receive
        # is the fairer CPU figure when the two differ.
        per_receive = cpu * floor["receives_per_s"] / max(run["receives_per_s"], 1e-9)
        lines.append(
            f"{run['strategy']} vs floor: RSS {rss:+.0f} MiB (goal <= +50), CPU {cpu:.2f}x "
            f"(goal <= 1.2; per receive {per_receive:.2f}x), broker RPC/s "
            f"{run['broker_rpcs_per_s']:.0f} (goal 0), errors {run['client_errors']} (goal 0)"
        )
    return lines


if __name__ == "__main__":  # python -m popmq.bench.idle [long_polls]
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    print(format_table(asyncio.run(bench_idle(long_polls=count))))
