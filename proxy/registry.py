"""ClientRegistry: the clients this proxy has heard from (soft state).

Filled by Telemetry settings and heartbeats, emptied by NotifyClientTermination or silence.
It serves admin listings, the Settings answer, and server-side queue assignment (which clients
share a group). Losing it loses nothing: clients heartbeat every 10 s and it refills.

With authentication on, clients are told apart by access key and client id: an id is only what
a client says (it travels in every request's x-mq-client-id header, and official clients make
it from host name, pid and a start time), so another user who learns or guesses one reaches
only an entry of its own under it. It can neither refresh, rewrite or remove the real
client's entry, nor, by registering the id first, lock the real client out of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from popmq.broker.contract.errors import Code, RefusedError

from popmq.clock import SYSTEM, Clock

# RocketMQ drops a client channel after 120 s without a heartbeat.
CLIENT_EXPIRY_S = 120.0
SWEEP_EVERY_S = 1.0  # lookups sweep expired clients at most this often


@dataclass(slots=True)
class ClientInfo:
    client_id: str
    client_type: str = ""  # ClientType name: PRODUCER, SIMPLE_CONSUMER, PUSH_CONSUMER ...
    group: str = ""
    topics: set[str] = field(default_factory=set)
    language: str = ""
    version: str = ""
    peer: str = ""
    first_seen: float = 0.0
    last_seen: float = 0.0
    telemetry_open: bool = False
    access_key: str = ""  # who registered it ("" without authentication)


def member_id(client_id: str, access_key: str) -> str:
    """A client's identity in its group's queue assignment: its id, under its access key when
    there is one (two users' clients that share an id are two members)."""
    return f"{client_id}|{access_key}" if access_key else client_id


class ClientRegistry:
    def __init__(
        self,
        expiry_s: float = CLIENT_EXPIRY_S,
        clock: Clock = SYSTEM,
        *,
        max_per_access_key: int | None = None,
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        self._expiry_s = expiry_s
        self._clock = clock
        # Seen times are wall-clock seconds (the admin API and CLI show them as times).
        self._now = lambda: clock.now_ms() / 1000
        self._clients: dict[tuple[str, str], ClientInfo] = {}  # by (access key, client id)
        # Live entries per access key ("" = no ACL: not limited), bounded by max_per_access_key.
        self._per_key: dict[str, int] = {}
        self._max_per_key = max_per_access_key
        self._on_refused = on_refused
        self._next_sweep = 0.0
        self.sweeps = 0  # full passes over the table (tests count them)

    def touch(
        self,
        client_id: str,
        *,
        client_type: str | None = None,
        group: str | None = None,
        topics: set[str] | None = None,
        language: str = "",
        version: str = "",
        peer: str = "",
        access_key: str = "",
    ) -> ClientInfo:
        """Record that a client is alive, updating what it told us."""
        now = self._now()
        info = self.get(client_id, access_key)
        if info is None:
            info = self._clients.get((access_key, client_id))  # expired, not swept: anew
            if info is not None:
                info.first_seen = now
        if info is None:
            self._admit(access_key)
            info = ClientInfo(client_id=client_id, first_seen=now, access_key=access_key)
            self._clients[access_key, client_id] = info
            if access_key:
                self._per_key[access_key] = self._per_key.get(access_key, 0) + 1
        info.last_seen = now
        if client_type:
            info.client_type = client_type
        if group:
            info.group = group
        if topics is not None:
            info.topics = set(topics)
        info.language = language or info.language
        info.version = version or info.version
        info.peer = peer or info.peer
        return info

    def set_telemetry(self, client_id: str, open_: bool, access_key: str = "") -> None:
        info = self._clients.get((access_key, client_id))
        if info is not None:
            info.telemetry_open = open_

    def remove(self, client_id: str, access_key: str = "") -> None:
        """Forget a client (it terminated): only the caller's own entry under that id."""
        if self._clients.pop((access_key, client_id), None) is not None:
            self._forget(access_key)

    def _admit(self, access_key: str) -> None:
        """TOO_MANY_REQUESTS when this access key already has its most client ids."""
        most = self._max_per_key
        if not access_key or most is None or self._per_key.get(access_key, 0) < most:
            return
        self._next_sweep = 0.0  # count only the live ones before refusing
        self._expire()
        if self._per_key.get(access_key, 0) < most:
            return
        if self._on_refused is not None:
            self._on_refused()
        raise RefusedError(
            Code.TOO_MANY_REQUESTS,
            f"access key {access_key!r} has {most} clients on this proxy already "
            "(proxy.max_clients_per_access_key)",
        )

    def _forget(self, access_key: str) -> None:
        if access_key:
            left = self._per_key.get(access_key, 0) - 1
            if left > 0:
                self._per_key[access_key] = left
            else:
                self._per_key.pop(access_key, None)

    def get(self, client_id: str, access_key: str = "") -> ClientInfo | None:
        self._expire()
        info = self._clients.get((access_key, client_id))
        if info is not None and info.last_seen < self._now() - self._expiry_s:
            return None  # silent too long: gone, though the next sweep has not run yet
        return info

    def clients(self, group: str | None = None) -> list[ClientInfo]:
        self._expire()
        horizon = self._now() - self._expiry_s
        found = [
            c
            for c in self._clients.values()
            if c.last_seen >= horizon and (group is None or c.group == group)
        ]
        return sorted(found, key=lambda c: (c.client_id, c.access_key))

    def group_members(self, group: str, topic: str | None = None) -> list[str]:
        """Sorted member ids (see member_id) of the live consumers of a group (subscribed to
        topic, if given)."""
        return sorted(
            member_id(c.client_id, c.access_key)
            for c in self.clients(group)
            if c.client_type != "PRODUCER" and (topic is None or not c.topics or topic in c.topics)
        )

    def _expire(self) -> None:
        """Drop clients silent past the expiry: a pass over the whole table, so at most once
        a second for lookups (every heartbeat and receive looks one up: a pass each made a
        table of many client ids, which any caller can add, cost every request its size)."""
        clock = self._now()
        if clock < self._next_sweep:
            return
        self._next_sweep = clock + SWEEP_EVERY_S
        self.sweeps += 1
        horizon = clock - self._expiry_s
        for key in [key for key, c in self._clients.items() if c.last_seen < horizon]:
            del self._clients[key]
            self._forget(key[0])
