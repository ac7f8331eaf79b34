"""The console beside `popmq serve` with no ACL: the JSON API and the pages in a real browser
(create a topic, send and look up a message, resend from the DLQ, reset an offset, see the
clients page fill), and a screenshot of each page."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from console_support import api, dead_letter, screenshot, serve_with_console
from support.official_clients import ClientSession, PopmqProcess, unique

pytestmark = [pytest.mark.slow, pytest.mark.wallclock, pytest.mark.subprocess]


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PopmqProcess, str, str]]:
    process, endpoint, url = serve_with_console(tmp_path_factory.mktemp("console-open"))
    yield process, endpoint, url
    assert process.stop() == 0


def test_serve_prints_the_console_url_and_says_it_is_open(served: Any) -> None:
    process, _, url = served
    assert url.startswith("http://127.0.0.1:")
    process.reader.wait_for("the proxy has no ACL, so the console is open", timeout=10)


def test_json_api_round_trip(served: Any) -> None:
    _, endpoint, url = served
    topic, group = unique("api"), unique("api-group")
    with api(url) as http:
        assert http.get("/api/v1/whoami").json() == {"acl": False, "admin": True, "access_key": ""}
        created = http.post("/api/v1/topics", json={"name": topic, "queues": 2})
        assert created.status_code == 200, created.text
        assert created.json()["queues"] == 4  # 2 queues on each of 2 brokers
        listed = http.get("/api/v1/topics").json()["topics"]
        assert [t["messages"] for t in listed if t["name"] == topic] == [0]

        message = {"topic": topic, "body": '{"n": 1}', "keys": ["k1"], "tag": "t"}
        sent = http.post("/api/v1/messages", json=message)
        assert sent.status_code == 200, sent.text
        message_id = sent.json()["message_id"]
        by_id = http.get("/api/v1/messages", params={"id": message_id}).json()["messages"]
        assert [(m["topic"], m["body_text"], m["keys"]) for m in by_id] == [
            (topic, '{"n": 1}', ["k1"])
        ]
        by_key = http.get("/api/v1/messages", params={"key": "k1", "topic": topic}).json()
        assert [m["message_id"] for m in by_key["messages"]] == [message_id]
        stored = by_id[0]["store_timestamp_ms"]
        window = {"topic": topic, "since": _iso(stored), "until": _iso(stored + 1)}
        in_range = http.get("/api/v1/messages", params=window).json()["messages"]
        assert [m["message_id"] for m in in_range] == [message_id]
        later = http.get("/api/v1/messages", params={"topic": topic, "since": _iso(stored + 1)})
        assert later.json()["messages"] == []
        described = http.get(f"/api/v1/topics/{topic}").json()
        assert described["messages"] == 1 and described["route"]["proxy"] == endpoint

        dead_topic = unique("api-dead")  # only the poison message in it
        assert http.post("/api/v1/topics", json={"name": dead_topic, "queues": 1}).is_success
        dead = dead_letter(endpoint, dead_topic, group)
        dlq = http.get(f"/api/v1/dlq/{group}").json()
        assert dlq["total"] == 1
        assert [m["origin_message_id"] or m["message_id"] for m in dlq["messages"]] == [dead]
        resent = http.post(f"/api/v1/dlq/{group}/resend", json={"ids": [dead]})
        assert resent.status_code == 200, resent.text
        assert [m["topic"] for m in resent.json()["resent"]] == [dead_topic]

        groups = {g["name"]: g for g in http.get("/api/v1/groups").json()["groups"]}
        assert groups[group]["dlq"] == 1 and groups[group]["max_attempts"] == 1
        reset = http.post(f"/api/v1/groups/{group}/reset-offset",
                          json={"topic": dead_topic, "to": "2000-01-01T00:00:00Z"})  # fmt: skip
        assert reset.status_code == 200, reset.text
        assert all(q["new_offset"] == 0 for q in reset.json()["queues"])
        assert http.get("/api/v1/cluster").json()["brokers"][0]["reachable"] is True
        assert "metrics" in http.get("/api/v1/longpoll").json()


def test_json_api_refuses_bad_input_with_a_code(served: Any) -> None:
    _, _, url = served
    with api(url) as http:
        no_json = http.post("/api/v1/topics", content="name=x")
        assert no_json.status_code == 415
        bad = http.post("/api/v1/topics", json={"name": "bad name!", "queues": 1})
        assert bad.status_code == 400 and bad.json()["error"]["code"].startswith("ILLEGAL")
        wrong_type = http.post("/api/v1/topics", json={"name": "x", "queues": True})
        assert wrong_type.status_code == 400
        missing = http.get("/api/v1/topics/no-such-topic")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "TOPIC_NOT_FOUND"
        no_query = http.get("/api/v1/messages")
        assert no_query.status_code == 400
        bad_time = http.post("/api/v1/groups/g/reset-offset", json={"topic": "t", "to": "soon"})
        assert bad_time.status_code == 400 and "ISO 8601" in bad_time.json()["error"]["message"]


def test_numbers_out_of_range_are_a_400_not_a_500(served: Any) -> None:
    """The admin requests hold 32-bit numbers: a bigger one is the user's mistake."""
    _, _, url = served
    huge = str(10**20)
    with api(url) as http:
        for path in (f"/api/v1/messages?id=x&limit={huge}", f"/api/v1/dlq/g?limit={huge}"):
            got = http.get(path)
            assert got.status_code == 400 and "out of range" in got.text, (path, got.text)
        created = http.post("/api/v1/topics", json={"name": unique("big"), "queues": 10**20})
        assert created.status_code == 400 and "out of range" in created.text
        page = http.post("/topics", data={"name": unique("big"), "queues": huge})
        assert page.status_code == 400 and "out of range" in page.text
        for limit in (0, 10_001, 2**31 - 1):  # each dead letter is read whole to answer
            listed = http.get(f"/api/v1/dlq/g?limit={limit}")
            assert listed.status_code == 400 and "within [1, 10000]" in listed.text, limit
        assert http.get("/api/v1/dlq/g?limit=10000").status_code == 200


def test_another_origin_cannot_make_changes(served: Any) -> None:
    """CSRF: with no ACL there is no cookie to hold back, so another site's form post (or one
    from another port of this host: the same site) must be refused by where it comes from."""
    _, _, url = served
    host = url.removeprefix("http://")
    topic = unique("csrf")
    with api(url) as http:
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
            {"Referer": "http://evil.example/page"},
            {"Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "same-site"},
            {"Sec-Fetch-Site": "cross-site"},
        ):
            form = http.post("/topics", data={"name": topic, "queues": "1"}, headers=headers)
            assert form.status_code == 403, (headers, form.status_code)
            sent = http.post("/messages/send", data={"topic": topic, "body": "x"}, headers=headers)
            assert sent.status_code == 403, (headers, sent.status_code)
            api_write = http.post("/api/v1/topics", json={"name": topic}, headers=headers)
            assert api_write.status_code == 403, (headers, api_write.status_code)
        listed = http.get("/api/v1/topics").json()["topics"]
        assert topic not in [t["name"] for t in listed]
        own = {"Origin": url, "Sec-Fetch-Site": "same-origin", "Host": host}
        created = http.post("/topics", data={"name": topic, "queues": "1"}, headers=own)
        assert created.status_code == 303, created.text
        assert topic in [t["name"] for t in http.get("/api/v1/topics").json()["topics"]]


def test_on_loopback_another_host_name_is_refused(served: Any) -> None:
    """DNS rebinding: a page of another name that resolves to 127.0.0.1 is its own origin
    (Origin and Host agree), so a loopback console answers only to loopback names."""
    _, _, url = served
    port = url.rsplit(":", 1)[1]
    with api(url) as http:
        for host in (f"evil.example:{port}", f"127.0.0.1.evil.example:{port}", "[::1"):
            read = http.get("/api/v1/topics", headers={"Host": host})
            assert read.status_code == 403, (host, read.status_code)
            page = http.get("/cluster", headers={"Host": host})
            assert page.status_code == 403, (host, page.status_code)
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
            assert http.get("/api/v1/topics", headers={"Host": host}).status_code == 200
        odd = http.post("/api/v1/topics", json={"name": "x"}, headers={"Origin": "http://[::1"})
        assert odd.status_code == 403  # refused, not an error page


def test_pages_in_a_browser(served: Any, browser: Any, tmp_path: Path) -> None:
    _, endpoint, url = served
    topic, group = unique("page"), unique("page-group")
    page = browser.new_page(viewport={"width": 1100, "height": 640})
    page.on("dialog", lambda dialog: dialog.accept())  # the confirm() before a resend

    page.goto(f"{url}/topics")
    page.fill("#create-topic input[name=name]", topic)
    page.fill("#create-topic input[name=queues]", "2")
    page.click("#create-topic button")
    page.wait_for_selector(f"text=Created topic {topic}")
    assert page.locator(f"#topics >> text={topic}").count() == 1
    screenshot(page, "topics", tmp_path)

    page.goto(f"{url}/messages")
    page.fill("#send-message input[name=topic]", topic)
    page.fill("#send-message input[name=keys]", "order-42")
    page.fill("#send-message textarea[name=body]", '{"order": 42, "total": 9.5}')
    page.click("#send-message button")
    sent = page.wait_for_selector("text=/Sent message [0-9A-F]+/").inner_text()
    message_id = re.search(r"Sent message ([0-9A-F]+)", sent).group(1)  # type: ignore[union-attr]
    page.select_option("select[name=format]", "json")
    page.fill("#find-message input[name=id]", "")
    page.fill("#find-message input[name=key]", "order-42")
    page.click("#find-message button")
    page.wait_for_selector(f"text={message_id}")
    assert json.loads(page.inner_text("pre.body")) == {"order": 42, "total": 9.5}
    screenshot(page, "messages", tmp_path)

    dead_topic = unique("page-dead")  # only the poison message in it
    with api(url) as http:
        assert http.post("/api/v1/topics", json={"name": dead_topic, "queues": 1}).is_success
    dead = dead_letter(endpoint, dead_topic, group)
    page.goto(f"{url}/dlq?group={group}")
    assert page.locator("#dlq tbody tr").count() == 1
    screenshot(page, "dlq", tmp_path)
    page.click("#dlq button.resend")
    page.wait_for_selector("text=Resent 1 messages")
    with api(url) as http:
        found = http.get("/api/v1/messages", params={"key": "dead-key", "topic": dead_topic}).json()
    assert dead in {m["message_id"] for m in found["messages"]}
    assert len(found["messages"]) == 2  # the original and the resent copy

    page.goto(f"{url}/groups?name={group}")
    page.fill("#reset-offset input[name=topic]", dead_topic)
    page.select_option("#reset-offset select[name=to]", "earliest")
    page.click("#reset-offset button")
    page.wait_for_selector("text=/Offsets reset .*queues moved/")
    screenshot(page, "groups", tmp_path)

    producer = ClientSession({"endpoint": endpoint, "role": "producer", "topics": [topic]},
                             tmp_path)  # fmt: skip
    try:
        page.goto(f"{url}/clients")
        page.wait_for_selector("#clients >> text=Producer", timeout=20_000)
        assert producer.client_id and page.locator(f"text={producer.client_id}").count() == 1
        screenshot(page, "clients", tmp_path)
    finally:
        producer.close()

    page.goto(f"{url}/cluster")
    page.wait_for_selector("#brokers >> text=broker-1")
    page.wait_for_timeout(5500)  # one refresh: the charts get their second sample
    assert page.locator("svg.chart polyline").count() == 2
    screenshot(page, "cluster", tmp_path)
    page.goto(f"{url}/longpoll")
    assert page.locator("#held-polls").count() == 1
    screenshot(page, "longpoll", tmp_path)
    page.close()


def test_console_port_0_turns_it_off_and_a_taken_port_is_one_line(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    from support.official_clients import REPO

    off = PopmqProcess(["serve", "--port", "0", "--brokers", "1", "--console-port", "0",
                        "--data-dir", str(tmp_path / "data")], tmp_path / "off.log")  # fmt: skip
    try:
        off.wait_listening()
    finally:
        assert off.stop() == 0
    assert not any("console" in line for line in off.reader.seen)

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        taken = subprocess.run(
            [sys.executable, "-m", "popmq", "console", "--endpoint", "127.0.0.1:1",
             "--port", str(port)],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        # `popmq serve` whose console port is taken: one warning, and the proxy serves on
        busy = PopmqProcess(["serve", "--port", "0", "--brokers", "1", "--data-dir",
                             str(tmp_path / "busy"), "--console-port", str(port)],
                            tmp_path / "busy.log")  # fmt: skip
        try:
            busy.wait_listening()
            time.sleep(1)
            assert busy.process.poll() is None
        finally:
            assert busy.stop() == 0
    assert taken.returncode == 2 and "Traceback" not in taken.stderr
    assert f"could not listen on 127.0.0.1:{port}" in taken.stdout
    log = (tmp_path / "busy.log").read_text()
    assert "console not started" in log and "Traceback" not in log
