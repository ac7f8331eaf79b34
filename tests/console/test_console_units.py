"""The console's pure parts: JSON shapes, bodies, charts, credentials, sessions, redirects."""

from __future__ import annotations

import base64

import pytest

from popmq.console import identity
from popmq.console.admin_client import ConsoleError, Credentials, http_status_of
from popmq.console.charts import line_chart
from popmq.console.pages import _safe_next
from popmq.console.views import Rates, parse_time_ms, plain, render_body
from popmq.pb.admin.v1 import admin_pb2 as a


def test_plain_keeps_every_field_with_numbers_as_numbers() -> None:
    view = a.StoredMessageView(topic="t", queue_offset=2**40, body=b"\x00\xff")
    out = plain(view)
    assert out["queue_offset"] == 2**40 and out["queue_id"] == 0  # zero kept, not a string
    assert out["keys"] == [] and out["properties"] == {}
    assert base64.b64decode(out["body"]) == b"\x00\xff"
    assert "status" not in plain(a.ListDlqResponse(total=3))


def test_bodies_as_text_json_and_hex() -> None:
    assert render_body(b'{"a":1}', "json") == '{\n  "a": 1\n}'
    assert render_body(b"not json", "json") == "not json"
    assert render_body(b"\x00\x01AB", "hex") == "00 01 41 42"
    assert render_body(b"caf\xc3\xa9 \xff", "text") == "café \ufffd"


def test_times_are_iso_8601_and_a_bad_one_is_a_400() -> None:
    assert parse_time_ms("1970-01-01T00:00:01Z") == 1000
    assert parse_time_ms("1970-01-01T00:00:01") == 1000  # no zone: UTC
    with pytest.raises(ConsoleError) as caught:
        parse_time_ms("yesterday")
    assert caught.value.http_status == 400


def test_refusal_codes_map_to_http_statuses() -> None:
    assert [http_status_of(c) for c in (40100, 40300, 40402, 40000, 50001)] == [
        401, 403, 404, 400, 502,
    ]  # fmt: skip


def test_rates_per_second_and_a_restarted_proxy_starts_over() -> None:
    rates = Rates()
    rates.add(100.0, 0, 0)
    rates.add(110.0, 50, 20)
    assert rates.series() == {"in": [[110.0, 5.0]], "out": [[110.0, 2.0]]}
    rates.add(120.0, 3, 1)  # counters went back: the proxy restarted
    assert rates.series() == {"in": [], "out": []}


def test_chart_is_inline_svg_with_escaped_labels() -> None:
    svg = str(line_chart([[0, 1.0], [10, 3.0]], "in <b>"))
    assert svg.startswith("<svg") and "<polyline" in svg and "in &lt;b&gt;" in svg
    assert "collecting samples" in str(line_chart([], "x"))


def test_basic_credentials() -> None:
    header = "Basic " + base64.b64encode(b"ops:s3:cret").decode()
    assert identity.basic_credentials(header) == Credentials("ops", "s3:cret")
    for bad in (
        None,
        "",
        "Bearer x",
        "Basic !!!",
        "Basic " + base64.b64encode(b"nocolon").decode(),
    ):
        assert identity.basic_credentials(bad) is None
    assert "s3" not in repr(Credentials("ops", "s3:cret"))


def test_sessions_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(identity.time, "monotonic", lambda: now[0])
    sessions = identity.Sessions()
    sid = sessions.open(Credentials("ops", "x"))
    assert sessions.get(sid) == Credentials("ops", "x") and sessions.get("guess") is None
    now[0] += identity.SESSION_TTL_S + 1
    assert sessions.get(sid) is None


def test_login_redirects_only_within_the_console() -> None:
    assert _safe_next("/groups?name=g") == "/groups?name=g"
    for outside in ("//evil.example/x", "https://evil.example/", "/\\evil.example", "groups"):
        assert _safe_next(outside) == "/cluster"


def test_cluster_page_shows_leaders_and_replicas() -> None:
    """/cluster lists each replicated group's nodes: role, in-sync, lag ("-" until known)."""
    from popmq.console.pages import templates

    group = plain(a.BrokerGroup(name="g1", leader="g1-0", epoch=7, in_sync=["g1-0"], nodes=[
        a.GroupNode(name="g1-0", role="leader", lag_known=True),
        a.GroupNode(name="g1-1", role="follower", lag_bytes=4096, lag_s=0.5, lag_known=True),
        a.GroupNode(name="g1-2", role="down"),
    ]))  # fmt: skip
    leaderless = plain(a.BrokerGroup(name="g2", nodes=[a.GroupNode(name="g2-0", role="down")]))
    data = {"rates": {"in": [], "out": []}, "proxies": [], "brokers": [],
            "groups": [group, leaderless], "sent_total": 0, "delivered_total": 0}  # fmt: skip
    html = templates.get_template("cluster.html").render(data=data, request=None)
    table = html[html.index('<table id="groups">') :]
    rows = [row for row in table.split("<tr>")[2:] if "</td>" in row]
    cells = [[c.split(">")[-1] for c in row.split("</td>")[:-1]] for row in rows]
    assert [c[2] for c in cells] == ["g1-0", "g1-1", "g1-2", "g2-0"]
    assert [c[4] for c in cells] == ["yes", "no", "no", "no"]  # in sync
    assert [c[5] for c in cells] == ["0", "4096", "-", "-"]  # lag bytes
    assert "no leader" in rows[3] and "no leader" not in rows[0]
    assert 'badge bad">down' in rows[2]
    empty = templates.get_template("cluster.html").render(data={**data, "groups": []},
                                                          request=None)  # fmt: skip
    assert "follows none in etcd" in empty


async def test_a_namespaced_grant_reaches_the_console_with_its_namespace() -> None:
    """WhoAmI carries each grant's namespace: a non-admin with `namespace: prod` grants sees
    prod's topics (`prod%orders` behind the edge) and nothing outside prod. (A subscribe grant
    on any topic also failed here before: the console built it with `topics=None`, which the
    ACL model refuses, so such a user could not use the console at all.)"""

    class FakeProxy:
        async def call(self, method: str, request: object, credentials: object) -> object:
            return a.WhoAmIResponse(
                acl=True, access_key="prod-app",
                grants=[a.Grant(publish="orders-*", namespace="prod"),
                        a.Grant(subscribe_group="billing", any_topic=True, namespace="prod")],
            )  # fmt: skip

    who = await identity.who_is(FakeProxy(), Credentials("prod-app", "s"))  # type: ignore[arg-type]
    assert who.can_read_topic("prod%orders-1") and not who.can_read_topic("orders-1")
    assert who.can_see_group("prod%billing") and not who.can_see_group("billing")
