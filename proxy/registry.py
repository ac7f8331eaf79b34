"""ClientRegistry: the clients this proxy has heard from (soft state).

Filled by Telemetry settings and heartbeats, emptied by NotifyClientTermination or silence.
It serves admin listings, the Settings answer, and server-side queue assignment (which clients
share a group). Losing it loses nothing: clients heartbeat every 10 s and it refills.

With authentication on, a client id belongs to the access key that first registered it (until
it terminates or goes silent): another user who learns the id (it travels in every request's
x-mq-client-id header) may not refresh, rewrite or remove that entry (FORBIDDEN).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from popmq.broker.api.errors import BrokerError, Code

# RocketMQ drops a client channel after 120 s without a heartbeat.
CLIENT_EXPIRY_S = 120.0


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


class ClientRegistry:
    def __init__(
        self, expiry_s: float = CLIENT_EXPIRY_S, clock: Callable[[], float] = time.time
    ) -> None:
        self._expiry_s = expiry_s
        self._clock = clock
        self._clients: dict[str, ClientInfo] = {}

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
        """Record that a client is alive, updating what it told us. FORBIDDEN when the id is
        another access key's."""
        now = self._clock()
        info = self.check_owner(client_id, access_key)
        if info is None:
            info = ClientInfo(client_id=client_id, first_seen=now, access_key=access_key)
            self._clients[client_id] = info
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

    def check_owner(self, client_id: str, access_key: str) -> ClientInfo | None:
        """The live entry of `client_id` (None if there is none); FORBIDDEN if it was
        registered by another access key."""
        info = self.get(client_id)
        if info is not None and info.access_key != access_key:
            raise BrokerError(
                Code.FORBIDDEN,
                f"client id {client_id[:128]!r} is in use by another access key",
            )
        return info

    def set_telemetry(self, client_id: str, open_: bool, access_key: str = "") -> None:
        info = self._clients.get(client_id)
        if info is not None and info.access_key == access_key:
            info.telemetry_open = open_

    def remove(self, client_id: str, access_key: str = "") -> None:
        """Forget a client (it terminated); FORBIDDEN if the id is another access key's."""
        if self.check_owner(client_id, access_key) is not None:
            del self._clients[client_id]

    def get(self, client_id: str) -> ClientInfo | None:
        self._expire()
        return self._clients.get(client_id)

    def clients(self, group: str | None = None) -> list[ClientInfo]:
        self._expire()
        found = [c for c in self._clients.values() if group is None or c.group == group]
        return sorted(found, key=lambda c: c.client_id)

    def group_members(self, group: str, topic: str | None = None) -> list[str]:
        """Sorted ids of the live consumers of a group (subscribed to topic, if given)."""
        return sorted(
            c.client_id
            for c in self.clients(group)
            if c.client_type != "PRODUCER" and (topic is None or not c.topics or topic in c.topics)
        )

    def _expire(self) -> None:
        horizon = self._clock() - self._expiry_s
        for client_id in [cid for cid, c in self._clients.items() if c.last_seen < horizon]:
            del self._clients[client_id]
