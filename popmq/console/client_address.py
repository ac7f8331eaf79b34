"""Which address a console request comes from, for the failed-sign-in limit (login_limit.py).

The TCP peer, unless the peer is one of ``console.trusted_proxies``: then X-Forwarded-For,
read from the right (the hops the trusted proxies appended), and the first address that is
not itself a trusted proxy is the client's. Everything left of it was written by the client,
so it is never believed: with no trusted proxies the header is ignored altogether.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from starlette.requests import Request

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """``console.trusted_proxies`` (validated by the config model) as networks."""
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def _is_trusted(address: str, trusted: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in trusted)


def client_address(request: Request, trusted: Sequence[Network]) -> str:
    peer = request.client.host if request.client else ""
    if not trusted or not _is_trusted(peer, trusted):
        return peer
    hops = [
        hop.strip()
        for header in request.headers.getlist("x-forwarded-for")
        for hop in header.split(",")
    ]
    for hop in reversed(hops):
        if not hop:
            continue
        address = _host_of(hop)
        if address is None:
            return peer  # a hop we cannot read: counted as the proxy's own
        if not _is_trusted(address, trusted):
            return address
    return peer  # no header, or only trusted hops: the proxy itself is the client


def _host_of(hop: str) -> str | None:
    """The IP address of one X-Forwarded-For entry (some proxies add the port:
    ``203.0.113.7:5000``, ``[2001:db8::1]:443``), or None if it holds none."""
    if hop.startswith("["):
        hop = hop[1:].partition("]")[0]
    elif hop.count(":") == 1:
        hop = hop.partition(":")[0]
    try:
        return str(ipaddress.ip_address(hop))
    except ValueError:
        return None
