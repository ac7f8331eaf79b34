"""Where clients reach this proxy: the address every route and assignment names."""

from __future__ import annotations

from dataclasses import dataclass

from popmq.config import ProxyConfig


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class ProxyAddress:
    """The bound address (set once the server listens) and the configured advertised one."""

    def __init__(self, config: ProxyConfig) -> None:
        self._config = config
        self.bound = HostPort("127.0.0.1", 0)

    def bind(self, host: str, port: int) -> None:
        # A wildcard bind is reached on loopback from this machine.
        self.bound = HostPort("127.0.0.1" if host in ("0.0.0.0", "::", "") else host, port)

    def for_client(self, client_used_one: bool) -> HostPort | None:
        """The address clients must use for every later RPC; None: the one the client reached
        us at (``client_used_one``: it said which), as RocketMQ's proxy answers.

        An explicitly advertised address wins; then the client's own; else the bound one."""
        config = self._config
        if config.advertise_host:
            return HostPort(config.advertise_host, config.advertise_port or self.bound.port)
        if client_used_one:
            return None
        return self.bound
