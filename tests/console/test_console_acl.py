"""The console with an ACL on the proxy: `popmq console` in its own process against a real
`popmq serve --acl`. No credentials: 401; a non-admin: 403 for writes and only its granted
topics and groups for reads; the login form and its session cookie in a real browser."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_support import admin_call, api, screenshot, start_console
from support.official_clients import PopmqProcess, serve, unique

from popmq.console.admin_client import AdminTarget
from popmq.pb.admin.v1 import admin_pb2 as a

pytestmark = [pytest.mark.slow, pytest.mark.wallclock, pytest.mark.subprocess]

ADMIN = ("ops", "ops-secret")
APP = ("app1", "app1-secret")
ACL = """
users:
  - access_key: ops
    secret_key: ops-secret
    admin: true
  - access_key: app1
    secret_key: app1-secret
    allow:
      - publish: mine-*
      - subscribe: {group: mygroup-*, topics: [mine-*]}
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("console-acl")
    acl = root / "acl.yaml"
    acl.write_text(ACL)
    os.chmod(acl, 0o600)
    proxy: PopmqProcess = serve(root / "data", brokers=1, extra_args=["--acl", str(acl)])
    try:
        endpoint = f"127.0.0.1:{proxy.wait_listening()}"
        console, url = start_console(endpoint, root, "--access-key", ADMIN[0],
                                     "--secret-key", ADMIN[1])  # fmt: skip
    except BaseException:
        proxy.stop()  # never left running when the console cannot start
        raise
    names = {"mine": unique("mine"), "other": unique("other"),
             "mygroup": unique("mygroup"), "theirs": unique("theirs")}  # fmt: skip
    for key in ("mine", "other"):
        admin_call(endpoint, "CreateTopic", a.CreateTopicRequest(name=names[key], queue_count=1),
                   ADMIN)  # fmt: skip
    for key in ("mygroup", "theirs"):
        admin_call(endpoint, "UpdateGroup", a.UpdateGroupRequest(name=names[key], max_attempts=3),
                   ADMIN)  # fmt: skip
    yield {"endpoint": endpoint, "url": url, **names}
    assert console.stop() == 0
    assert proxy.stop() == 0


def test_no_or_wrong_credentials_get_401(secured: dict[str, Any]) -> None:
    with api(secured["url"]) as http:
        anonymous = http.get("/api/v1/topics")
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"].startswith("Basic")
        assert anonymous.json()["error"]["code"] == "UNAUTHORIZED"
        assert http.get("/topics").status_code == 303  # pages send you to the login form
    with api(secured["url"], ("ops", "wrong")) as http:
        assert http.get("/api/v1/topics").status_code == 401
    with api(secured["url"], ("nobody", "x")) as http:
        assert http.get("/api/v1/cluster").status_code == 401


def test_admin_sees_and_changes_everything(secured: dict[str, Any]) -> None:
    with api(secured["url"], ADMIN) as http:
        assert http.get("/api/v1/whoami").json() == {"acl": True, "admin": True,
                                                     "access_key": "ops"}  # fmt: skip
        names = {t["name"] for t in http.get("/api/v1/topics").json()["topics"]}
        assert {secured["mine"], secured["other"]} <= names
        created = http.post("/api/v1/topics", json={"name": unique("ops-made"), "queues": 1})
        assert created.status_code == 200, created.text


def test_non_admin_reads_only_its_grants_and_may_not_write(secured: dict[str, Any]) -> None:
    with api(secured["url"], APP) as http:
        assert http.get("/api/v1/whoami").json()["admin"] is False
        names = {t["name"] for t in http.get("/api/v1/topics").json()["topics"]}
        assert secured["mine"] in names and secured["other"] not in names
        groups = {g["name"] for g in http.get("/api/v1/groups").json()["groups"]}
        assert secured["mygroup"] in groups and secured["theirs"] not in groups
        assert http.get(f"/api/v1/topics/{secured['mine']}").status_code == 200
        assert http.get(f"/api/v1/topics/{secured['other']}").status_code == 403
        assert http.get(f"/api/v1/groups/{secured['theirs']}").status_code == 403
        assert http.get(f"/api/v1/dlq/{secured['theirs']}").status_code == 403
        refused = http.post("/api/v1/topics", json={"name": "mine-new", "queues": 1})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "FORBIDDEN"
        send = http.post("/api/v1/messages", json={"topic": secured["mine"], "body": "x"})
        assert send.status_code == 403
        reset = http.post(f"/api/v1/groups/{secured['mygroup']}/reset-offset",
                          json={"topic": secured["mine"], "to": "latest"})  # fmt: skip
        assert reset.status_code == 403


def test_a_group_page_shows_only_the_topics_the_grant_reaches(secured: dict[str, Any]) -> None:
    """A grant on a group for some topics showed the group's progress on every topic it had
    consumed (other users' topics' names, offsets and lags) through the console's own keys."""
    endpoint, group, other = secured["endpoint"], unique("mygroup-wide"), secured["other"]
    admin_call(endpoint, "UpdateGroup", a.UpdateGroupRequest(name=group, max_attempts=3), ADMIN)
    for topic in (secured["mine"], other):
        admin_call(endpoint, "SendTestMessage", a.SendTestMessageRequest(topic=topic, body=b"x"),
                   ADMIN)  # fmt: skip
        admin_call(endpoint, "ResetOffset",
                   a.ResetOffsetRequest(group=group, topic=topic, latest=True), ADMIN)  # fmt: skip
    with api(secured["url"], ADMIN) as http:
        admin_view = http.get(f"/api/v1/groups/{group}").json()
        seen = {q["topic"] for q in admin_view.get("queues", [])}
        assert {secured["mine"], other} <= seen, admin_view  # the admin sees both
    with api(secured["url"], APP) as http:
        answer = http.get(f"/api/v1/groups/{group}")
        assert answer.status_code == 200
        seen = {q["topic"] for q in answer.json()["queues"]}
        assert secured["mine"] in seen and not any(other in t for t in seen), seen
        listed = {g["name"]: g for g in http.get("/api/v1/groups").json()["groups"]}
        assert group in listed


def test_a_client_shows_a_non_admin_only_the_topics_its_grant_reaches(
    secured: dict[str, Any],
) -> None:
    """A client of a group the user may see was listed with every topic it subscribed to,
    other users' topics included (their names)."""
    import grpc

    from popmq.pb.rocketmq.v2 import definition_pb2 as pb
    from popmq.pb.rocketmq.v2 import service_pb2 as s
    from popmq.pb.rocketmq.v2 import service_pb2_grpc
    from popmq.security.signature import signed_metadata

    group, client_id = unique("mygroup-c"), unique("client")
    admin_call(secured["endpoint"], "UpdateGroup", a.UpdateGroupRequest(name=group, max_attempts=3),
               ADMIN)  # fmt: skip
    topics = [secured["mine"], secured["other"]]
    settings = pb.Settings(
        client_type=pb.SIMPLE_CONSUMER,
        subscription=pb.Subscription(
            group=pb.Resource(name=group),
            subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name=t)) for t in topics],
        ),
    )
    metadata = [*signed_metadata(*ADMIN), ("x-mq-client-id", client_id)]
    with grpc.insecure_channel(secured["endpoint"]) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        answers = stub.Telemetry(iter([s.TelemetryCommand(settings=settings)]), metadata=metadata)
        assert next(answers).status.code == 20000
        answers.cancel()
    with api(secured["url"], ADMIN) as http:
        row = next(c for c in http.get("/api/v1/clients").json()["clients"]
                   if c["client_id"] == client_id)  # fmt: skip
        assert sorted(row["topics"]) == sorted(topics)
    with api(secured["url"], APP) as http:
        rows = [c for c in http.get("/api/v1/clients").json()["clients"]
                if c["client_id"] == client_id]  # fmt: skip
        assert [r["topics"] for r in rows] == [[secured["mine"]]], rows
        page = http.get(f"/api/v1/groups/{group}").json()
        assert [c["topics"] for c in page.get("clients", [])] == [[secured["mine"]]], page


def test_console_without_its_own_keys_tells_a_non_admin_why(
    secured: dict[str, Any], tmp_path: Path
) -> None:
    console, url = start_console(secured["endpoint"], tmp_path)
    try:
        with api(url, APP) as http:
            refused = http.get("/api/v1/topics")
            assert refused.status_code == 403
            assert "no keys of its own" in refused.json()["error"]["message"]
        with api(url, ADMIN) as http:
            assert http.get("/api/v1/topics").status_code == 200
    finally:
        assert console.stop() == 0


def test_login_form_and_session_in_a_browser(
    secured: dict[str, Any], browser: Any, tmp_path: Path
) -> None:
    url = secured["url"]
    context = browser.new_context(viewport={"width": 1100, "height": 640})
    page = context.new_page()
    page.goto(f"{url}/topics")
    assert page.url.startswith(f"{url}/login")
    assert page.get_attribute("input[name=secret_key]", "type") == "password"
    screenshot(page, "login", tmp_path)
    page.fill("input[name=access_key]", "ops")
    page.fill("input[name=secret_key]", "not-it")
    page.click("button[type=submit]")
    page.wait_for_selector("[role=alert]")
    assert page.url.startswith(f"{url}/login")

    page.fill("input[name=secret_key]", ADMIN[1])
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/topics")
    assert page.inner_text("#whoami") == "ops (admin)"
    cookie = next(c for c in context.cookies() if c["name"] == "popmq_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert ADMIN[1] not in cookie["value"]  # the cookie names a session; the keys stay inside
    topic = unique("mine-form")
    page.fill("#create-topic input[name=name]", topic)
    page.click("#create-topic button")
    page.wait_for_selector(f"text=Created topic {topic}")
    page.click("text=Sign out")
    page.wait_for_url(f"{url}/login")
    page.goto(f"{url}/cluster")
    assert page.url.startswith(f"{url}/login")  # the session ended with the sign-out

    page.fill("input[name=access_key]", APP[0])
    page.fill("input[name=secret_key]", APP[1])
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/cluster")
    page.goto(f"{url}/topics")
    assert page.inner_text("#whoami") == "app1 (read only)"
    assert page.locator("#create-topic").count() == 0
    assert page.locator(f"#topics >> text={secured['mine']}").count() == 1
    assert page.locator(f"#topics >> text={secured['other']}").count() == 0
    context.close()


def test_proxy_lets_any_user_ask_who_it_is_and_only_admins_send_test_messages(
    secured: dict[str, Any],
) -> None:
    import grpc

    from popmq.pb.admin.v1 import admin_pb2_grpc
    from popmq.security.signature import signed_metadata

    me = admin_call(secured["endpoint"], "WhoAmI", a.WhoAmIRequest(), APP)
    assert (me.acl, me.admin, me.access_key) == (True, False, "app1")
    assert [g.publish for g in me.grants if g.publish] == ["mine-*"]
    [subscribe] = [g for g in me.grants if g.subscribe_group]
    assert subscribe.subscribe_topics == ["mine-*"] and not subscribe.any_topic
    with grpc.insecure_channel(secured["endpoint"]) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        refused = stub.SendTestMessage(
            a.SendTestMessageRequest(topic=secured["mine"], body=b"x"),
            timeout=10, metadata=signed_metadata(*APP),
        )  # fmt: skip
        anonymous = stub.WhoAmI(a.WhoAmIRequest(), timeout=10)
    assert refused.status.code == 40300  # FORBIDDEN: the admin API's writes need admin
    assert anonymous.status.code == 40100  # UNAUTHORIZED


def test_failed_sign_ins_are_limited_per_address_and_per_access_key(
    secured: dict[str, Any],
) -> None:
    """/login could be tried without limit (a secret guessed at the proxy's speed): after
    login_limit.BURST failures from one address, or for one access key, it answers 429 with
    Retry-After, without asking the proxy, until the bucket refills. (On a loop of its own, in
    a thread: the browser tests' Playwright keeps one running in this one.)"""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _sign_ins_are_limited(secured)).result(timeout=60)


async def _sign_ins_are_limited(secured: dict[str, Any]) -> None:
    import httpx

    from popmq.console import login_limit
    from popmq.console.app import build_app
    from popmq.console.login_limit import LoginLimiter
    from popmq.console.state import ConsoleState

    now = [0.0]
    state = ConsoleState(AdminTarget(secured["endpoint"]))
    state.logins = LoginLimiter(clock=lambda: now[0])
    transport = httpx.ASGITransport(app=build_app(state))
    http = httpx.AsyncClient(
        transport=transport, base_url="http://testserver",
        headers={"origin": "http://testserver"},
    )  # fmt: skip

    async def sign_in(key: str, secret: str) -> httpx.Response:
        form = {"access_key": key, "secret_key": secret, "next": "/cluster"}
        return await http.post("/login", data=form)

    try:
        for _ in range(login_limit.BURST):
            assert (await sign_in(ADMIN[0], "guess")).status_code == 401
        limited = await sign_in(ADMIN[0], ADMIN[1])  # even the right secret waits
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert (await sign_in(APP[0], APP[1])).status_code == 429  # the same address
        now[0] += 1 / login_limit.REFILL_PER_S + 0.1
        assert (await sign_in(ADMIN[0], ADMIN[1])).status_code == 303  # one token back
    finally:
        await http.aclose()
        await state.client.close()
    # Another address, the same access key: limited by the key's own bucket.
    for _ in range(login_limit.BURST):
        state.logins.failed("10.0.0.9", "app1")
    assert state.logins.retry_after("10.0.0.8", "app1") > 0
    assert state.logins.retry_after("10.0.0.8", "ops") == 0


def test_the_login_limiter_table_is_bounded() -> None:
    from popmq.console import login_limit
    from popmq.console.login_limit import LoginLimiter

    limiter = LoginLimiter(clock=lambda: 0.0)
    for i in range(login_limit.MAX_BUCKETS + 50):
        limiter.failed(f"addr-{i}", "")
    assert len(limiter._buckets) == login_limit.MAX_BUCKETS


def test_failed_basic_auth_on_the_api_is_limited_like_the_login_form(
    secured: dict[str, Any],
) -> None:
    """The JSON API took a wrong Basic key pair without limit (a secret guessed at the proxy's
    speed) while /login had a limit: the same buckets now count the API's failures, and an
    empty one answers 429 with Retry-After, without asking the proxy."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _basic_auth_is_limited(secured)).result(timeout=60)


async def _basic_auth_is_limited(secured: dict[str, Any]) -> None:
    import httpx

    from popmq.console import login_limit
    from popmq.console.app import build_app
    from popmq.console.login_limit import LoginLimiter
    from popmq.console.state import ConsoleState

    now = [0.0]
    state = ConsoleState(AdminTarget(secured["endpoint"]))
    state.logins = LoginLimiter(clock=lambda: now[0])
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=build_app(state)), base_url="http://testserver"
    )
    try:
        assert (await http.get("/api/v1/whoami", auth=ADMIN)).status_code == 200  # costs nothing
        for _ in range(login_limit.BURST):
            assert (await http.get("/api/v1/whoami", auth=(ADMIN[0], "guess"))).status_code == 401
        limited = await http.get("/api/v1/topics", auth=ADMIN)  # even the right secret waits
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert limited.json()["error"]["code"] == "TOO_MANY_REQUESTS"
        assert (await http.get("/api/v1/whoami", auth=APP)).status_code == 429  # same address
        assert (await http.get("/cluster", auth=APP)).status_code == 429  # pages take Basic too
        now[0] += 1 / login_limit.REFILL_PER_S + 0.1
        assert (await http.get("/api/v1/whoami", auth=ADMIN)).status_code == 200
    finally:
        await http.aclose()
        await state.client.close()


def test_x_forwarded_for_does_not_buy_a_fresh_address_per_try(secured: dict[str, Any]) -> None:
    """uvicorn took the client address from X-Forwarded-For for connections from 127.0.0.1
    (its default forwarded_allow_ips), so a caller on the console's host named a new address
    on each failed /login and the per-address limit never applied. (Last in this module: it
    drains 127.0.0.1's bucket.)"""
    import httpx

    from popmq.console import login_limit

    url = secured["url"]
    answers = []
    with httpx.Client(base_url=url, headers={"origin": url}, timeout=10) as http:
        for i in range(login_limit.BURST + 1):
            form = {"access_key": f"nobody{i}", "secret_key": "guess", "next": "/cluster"}
            headers = {"x-forwarded-for": f"10.1.{i}.1", "x-forwarded-proto": "http"}
            answers.append(http.post("/login", data=form, headers=headers).status_code)
    # Earlier tests may have spent some of 127.0.0.1's tokens: the limit comes no later.
    assert answers[-1] == 429 and set(answers) == {401, 429}, answers


def test_a_stranger_guessing_a_key_does_not_lock_out_where_it_signs_in() -> None:
    """Ten wrong secrets for an access key, from anywhere, kept its owner out everywhere (a
    stranger could lock the admin out of the console for good at one try per 6 s). The key's
    bucket still holds every address that has not signed in as that key; one that has is held
    only by its own address bucket. Long access keys are kept as a digest (each bucket kept
    the whole form field)."""
    from popmq.console import login_limit
    from popmq.console.login_limit import LoginLimiter

    limiter = LoginLimiter(clock=lambda: 0.0)
    limiter.succeeded("10.0.0.1", "ops")
    for i in range(login_limit.BURST):
        limiter.failed(f"10.6.6.{i}", "ops")
    assert limiter.retry_after("10.6.6.99", "ops") > 0  # guessers, and new places, wait
    assert limiter.retry_after("10.0.0.1", "ops") == 0  # where the admin signs in: not
    for _ in range(login_limit.BURST):
        limiter.failed("10.0.0.1", "ops")
    assert limiter.retry_after("10.0.0.1", "ops") > 0  # its own address bucket still counts
    limiter.failed("10.0.0.7", "k" * 100_000)
    assert max(len(key) for key in limiter._buckets) <= 100


def test_a_stranger_guessing_does_not_lock_out_an_api_caller_where_it_signs_in(
    secured: dict[str, Any],
) -> None:
    """HTTP Basic on the API: as with /login's form, an address that has signed in as a key
    is not held by that key's bucket, which strangers elsewhere can drain."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:  # its own loop, as the Basic-auth test beside it
        pool.submit(asyncio.run, _api_caller_not_locked_out(secured)).result(timeout=60)


async def _api_caller_not_locked_out(secured: dict[str, Any]) -> None:
    import httpx

    from popmq.console import login_limit
    from popmq.console.app import build_app
    from popmq.console.login_limit import LoginLimiter
    from popmq.console.state import ConsoleState

    state = ConsoleState(AdminTarget(secured["endpoint"]))
    state.logins = LoginLimiter(clock=lambda: 0.0)
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=build_app(state)), base_url="http://testserver"
    )
    try:
        assert (await http.get("/api/v1/whoami", auth=ADMIN)).status_code == 200
        for i in range(login_limit.BURST):
            state.logins.failed(f"10.6.6.{i}", ADMIN[0])
        assert (await http.get("/api/v1/whoami", auth=ADMIN)).status_code == 200
    finally:
        await http.aclose()
        await state.client.close()
