"""Admission control: bounded long polls, and counted refusals of oversized requests.

Held receives cost the proxy memory, tasks and broker calls until they answer. Without bounds a
burst (thousands of groups, a misbehaving client opening receives in a loop) makes every
receive slow, until they run into their clients' deadlines and nobody gets an answer. So the
proxy holds at most ``max_long_polls`` receives, ``max_long_polls_per_client`` per client (see
poll_owner) and ``max_long_polls_per_group`` per group. Past a
bound a receive is refused at once with TOO_MANY_REQUESTS, as RocketMQ answers "polling full":
the client backs off and retries, and every call gets an answer in time.

Bounds on counts do not see a proxy starved of CPU, where even a few hundred polls that end
together are answered too late. So admission also watches the event loop's lag (how late a
100 ms timer fires). Its recent peak is kept as extra reserve before each deadline (see
receive.polling_time_ms). New long polls are shed only when the lag stays above
``max_loop_lag_ms`` on ``SUSTAINED_TICKS`` checks in a row: one stall (a GC pause, a slow
disk, a burst of starts on a shared machine) must not refuse healthy consumers.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter, deque

from popmq.broker.contract.errors import Code, RefusedError
from popmq.proxy.events import ProxyEvents

from popmq.config import ProxyConfig
from popmq.lifecycle import AsyncClosing, Job, TaskOwner

# Checks in a row above the bound before shedding. A check is a 100 ms timer, so at a 1 s lag
# each takes 1.1 s: about 3.3 s of sustained starvation. (Stalls alternating with quick ticks
# never shed; the deadline reserve, from the peak lag, covers those.)
SUSTAINED_TICKS = 3

_CREDENTIAL = re.compile(r"Credential=([^,\s]{1,128})")


def poll_owner(client_id: str, peer: str, authorization: str = "") -> str:
    """The key of the per-client bound: the client id (the peer address without one) under
    the caller's access key and from its host. The id is only what the client says it is:
    keyed on it alone, anyone sending another client's id (another user, another host) filled
    that client's bound and locked it out of receiving. With an ACL the access key is the one
    the access guard verified before the call got here."""
    match = _CREDENTIAL.search(authorization)
    access_key = match.group(1) if match else ""
    host = peer.rpartition(":")[0] or peer  # "ipv4:10.0.0.7:51234": any port of that host
    return f"{access_key}|{host}|{client_id or peer}"


class LongPollAdmission(AsyncClosing):
    def __init__(self, config: ProxyConfig, metrics: ProxyEvents) -> None:
        self._total_limit = config.max_long_polls
        self._client_limit = config.max_long_polls_per_client
        self._group_limit = config.max_long_polls_per_group
        self._metrics = metrics
        self._total = 0
        # Read at scrape time: a gauge set at every enter and leave was two locked updates a
        # receive.
        metrics.watch_active_long_polls(lambda: self._total)
        self._clients: Counter[str] = Counter()
        self._groups: Counter[str] = Counter()
        self._max_lag_ms = config.max_loop_lag_ms
        self.lag_ms = 0.0  # recent peak event-loop lag (decays), see _watch_lag
        self._recent_lags: deque[float] = deque(maxlen=SUSTAINED_TICKS)
        self._watcher: Job[None] | None = None
        self._tasks = TaskOwner("admission", grace_s=0)  # the lag monitor

    def start(self) -> None:
        """Start watching the event loop's lag (call on the proxy's loop)."""
        if self._watcher is None:
            self._watcher = self._tasks.spawn(self._watch_lag(), "admission-loop-lag")

    async def aclose(self) -> None:
        await self._tasks.aclose()
        self._tasks = TaskOwner("admission", grace_s=0)
        self._watcher = None

    async def _watch_lag(self, interval_s: float = 0.1) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(interval_s)
            late_ms = max(0.0, (loop.time() - before - interval_s) * 1000)
            # Rise at once, fall slowly: one quiet tick does not end an overload.
            self.lag_ms = max(late_ms, self.lag_ms * 0.8)
            self._recent_lags.append(late_ms)
            self._metrics.loop_lag(self.lag_ms / 1000)

    @property
    def sustained_lag_ms(self) -> float:
        """The lag each of the last SUSTAINED_TICKS checks saw (0 until there are that many)."""
        if len(self._recent_lags) < SUSTAINED_TICKS:
            return 0.0
        return min(self._recent_lags)

    @property
    def active(self) -> int:
        return self._total

    def enter(self, client: str, group: str) -> None:
        """Count one held receive, or raise TOO_MANY_REQUESTS (counted by reason)."""
        if self.sustained_lag_ms > self._max_lag_ms:
            self._refuse("overloaded", f"the proxy's event loop has lagged at least "
                         f"{self.sustained_lag_ms:.0f} ms on each of its last {SUSTAINED_TICKS} "
                         "checks, more than proxy.max_loop_lag_ms")  # fmt: skip
        if self._total >= self._total_limit:
            self._refuse("long_polls_total", f"the proxy holds {self._total} long polls, its "
                         "limit (proxy.max_long_polls)")  # fmt: skip
        if self._clients[client] >= self._client_limit:
            self._refuse("long_polls_per_client", f"this client holds {self._clients[client]} "
                         "long polls, the limit (proxy.max_long_polls_per_client)")  # fmt: skip
        if self._groups[group] >= self._group_limit:
            self._refuse("long_polls_per_group", f"group {group!r} holds {self._groups[group]} "
                         "long polls, the limit (proxy.max_long_polls_per_group)")  # fmt: skip
        self._total += 1
        self._clients[client] += 1
        self._groups[group] += 1

    def leave(self, client: str, group: str) -> None:
        self._total -= 1
        for counts, key in ((self._clients, client), (self._groups, group)):
            counts[key] -= 1
            if counts[key] <= 0:
                del counts[key]  # thousands of one-off groups must not stay in memory

    def _refuse(self, reason: str, why: str) -> None:
        self._metrics.refused(reason)
        raise RefusedError(Code.TOO_MANY_REQUESTS, f"polling full: {why}; retry later")


def refuse(metrics: ProxyEvents, reason: str, code: Code, message: str) -> RefusedError:
    """A counted refusal of an oversized request (batch, body, messages per send)."""
    metrics.refused(reason)
    return RefusedError(code, message)
