"""The console's failed-sign-in limit: a bounded table that forgetting cannot flush, and the
client address it counts (X-Forwarded-For only from console.trusted_proxies)."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from popmq.config import load_config
from popmq.console import login_limit
from popmq.console.admin_client import AdminTarget
from popmq.console.client_address import client_address, trusted_networks
from popmq.console.login_limit import LoginLimiter

TOKEN_S = 1 / login_limit.REFILL_PER_S


def _drain(limiter: LoginLimiter, address: str, key: str) -> None:
    for _ in range(login_limit.BURST):
        limiter.failed(address, key)


def test_flooding_the_table_does_not_forget_a_drained_bucket() -> None:
    """The buckets were a plain LRU: after ten wrong secrets for `ops`, failing from
    MAX_BUCKETS fresh addresses pushed the drained `ops` bucket out and it came back full
    (ten more guesses, as often as the flood was repeated)."""
    now = [0.0]
    limiter = LoginLimiter(clock=lambda: now[0])
    _drain(limiter, "10.6.6.6", "ops")
    assert limiter.retry_after("10.7.7.7", "ops") > 0
    for i in range(login_limit.MAX_BUCKETS + 100):
        limiter.failed(f"flood-{i}", "")  # each a new address bucket, left with 9 tokens
    assert len(limiter._buckets) <= login_limit.MAX_BUCKETS  # still bounded
    assert limiter.retry_after("10.7.7.7", "ops") > 0  # ops still drained
    assert limiter.retry_after("10.6.6.6", "") > 0  # and the guesser's own address


def test_refilled_buckets_go_first_and_a_table_of_empty_ones_takes_no_new_entry() -> None:
    now = [0.0]
    limiter = LoginLimiter(clock=lambda: now[0])
    for i in range(login_limit.MAX_BUCKETS):
        _drain(limiter, f"a-{i}", "")  # every bucket empty
    # A new place cannot be counted, so it waits until some bucket earns a token back.
    wait = limiter.retry_after("10.0.0.1", "")
    assert wait == pytest.approx(TOKEN_S, abs=1)
    limiter.failed("10.0.0.1", "")  # not counted, and nothing was forgotten for it
    assert "addr:10.0.0.1" not in limiter._buckets
    assert all(
        limiter.retry_after(f"a-{i}", "") > 0 for i in range(0, login_limit.MAX_BUCKETS, 997)
    )
    now[0] += wait
    assert limiter.retry_after("10.0.0.1", "") == 0  # a bucket with a token may now make room
    # A refilled bucket (the same as a new one) goes before an older one only partly refilled.
    now[0] = 100 * TOKEN_S  # every bucket full again by now...
    oldest, next_oldest = list(limiter._buckets)[:2]
    limiter._buckets[oldest].tokens, limiter._buckets[oldest].at = 5.0, now[0]  # ...but one
    limiter.failed("10.0.0.2", "")
    assert "addr:10.0.0.2" in limiter._buckets and len(limiter._buckets) == login_limit.MAX_BUCKETS
    assert oldest in limiter._buckets and next_oldest not in limiter._buckets


def _request(peer: str, *forwarded: str) -> Request:
    headers = [(b"x-forwarded-for", value.encode()) for value in forwarded]
    return Request({"type": "http", "client": (peer, 50000), "headers": headers})


def test_x_forwarded_for_counts_only_from_trusted_proxies() -> None:
    none = trusted_networks([])
    lbs = trusted_networks(["10.0.0.5", "10.1.0.0/16"])
    assert client_address(_request("10.0.0.5", "203.0.113.7"), none) == "10.0.0.5"  # default
    assert client_address(_request("198.51.100.1", "203.0.113.7"), lbs) == "198.51.100.1"
    assert client_address(_request("10.0.0.5", "203.0.113.7"), lbs) == "203.0.113.7"
    # The client's own entries are left of the ones the trusted proxies appended.
    chain = _request("10.0.0.5", "1.1.1.1, 203.0.113.7", "10.1.2.3")
    assert client_address(chain, lbs) == "203.0.113.7"
    assert client_address(_request("10.0.0.5"), lbs) == "10.0.0.5"  # no header
    assert client_address(_request("10.0.0.5", "not-an-address"), lbs) == "10.0.0.5"
    assert client_address(_request("10.0.0.5", "203.0.113.7:5000"), lbs) == "203.0.113.7"
    assert client_address(_request("10.0.0.5", "[2001:db8::1]:443"), lbs) == "2001:db8::1"
    assert client_address(_request("10.0.0.5", "2001:db8::1"), lbs) == "2001:db8::1"
    assert client_address(_request("10.0.0.5", "10.1.0.9"), lbs) == "10.0.0.5"  # all trusted


def test_trusted_proxies_setting() -> None:
    config = load_config(environ={"POPMQ_CONSOLE__TRUSTED_PROXIES": "10.0.0.5, fd00::/8"})
    assert config.console.trusted_proxies == ["10.0.0.5", "fd00::/8"]
    assert load_config(environ={}).console.trusted_proxies == []
    with pytest.raises(ValueError, match="not an IP address or network"):
        load_config(environ={"POPMQ_CONSOLE__TRUSTED_PROXIES": "lb.example"})


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_login_form_and_basic_auth_count_the_forwarded_client() -> None:
    """Behind a listed proxy, a drained client address is refused (429) before the proxy is
    asked, whatever address the reverse proxy itself has; without the setting the same header
    changes nothing (the peer's bucket is the one counted)."""
    from popmq.console.app import build_app
    from popmq.console.state import ConsoleState

    async def answers(trusted: list[str]) -> list[int]:
        state = ConsoleState(
            AdminTarget(f"127.0.0.1:{_closed_port()}"),  # never asked when the limit answers
            trusted_proxies=trusted_networks(trusted),
        )
        state.logins = LoginLimiter(clock=lambda: 0.0)
        _drain(state.logins, "203.0.113.7", "")
        transport = httpx.ASGITransport(app=build_app(state), client=("127.0.0.1", 4000))
        headers = {"origin": "http://testserver", "x-forwarded-for": "203.0.113.7"}
        got: list[int] = []
        async with httpx.AsyncClient(
            transport=transport, base_url="http://testserver", headers=headers
        ) as http:
            form = {"access_key": "ops", "secret_key": "guess", "next": "/cluster"}
            got.append((await http.post("/login", data=form)).status_code)
            basic: Any = ("ops", "guess")
            got.append((await http.get("/api/v1/whoami", auth=basic)).status_code)
        await state.client.close()
        return got

    assert await answers(["127.0.0.1"]) == [429, 429]
    assert 429 not in await answers([])
