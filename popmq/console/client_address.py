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
        if not _is_trusted(hop, trusted):
            return hop if _is_address(hop) else peer  # a hop we cannot read: the proxy's
    return peer  # no header, or only trusted hops: the proxy itself is the client


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
