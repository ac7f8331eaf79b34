"""The ACL file: users, publish/subscribe/admin grants, `*` patterns, deny by default."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from popmq.security.acl import AclFile, User, load_acl, matches

ACL = """
users:
  - access_key: app1
    secret_key: s3cr3t
    allow:
      - publish: orders
      - publish: "events-*"
      - subscribe: billing
      - subscribe: {group: "audit-*", topics: [orders, "pay-*"]}
  - access_key: ops
    secret_key: ops-secret
    admin: true
"""


def test_grants(tmp_path: Path) -> None:
    path = tmp_path / "acl.yaml"
    path.write_text(ACL)
    acl = load_acl(path)
    app = acl.user("app1")
    assert app is not None and acl.user("nobody") is None
    assert app.can_publish("orders") and app.can_publish("events-2026")
    assert not app.can_publish("orders-2") and not app.can_publish("events")
    assert app.can_subscribe("billing", "anything")  # a plain group: any topic
    assert app.can_subscribe("audit-1", "orders") and app.can_subscribe("audit-1", "pay-eu")
    assert not app.can_subscribe("audit-1", "refunds")
    assert not app.can_subscribe("billing2", "orders")
    assert not app.admin
    ops = acl.user("ops")
    assert ops is not None and ops.admin and ops.can_publish("x") and ops.can_subscribe("g", "t")
    assert "s3cr3t" not in repr(acl) and "s3cr3t" not in str(app)


def test_patterns_only_star() -> None:
    assert matches("a*", "abc") and matches("*", "") and matches("a*c", "abbc")
    assert not matches("a?c", "abc") and matches("a?c", "a?c")
    assert not matches("[ab]", "a") and matches("a.c", "a.c") and not matches("a.c", "abc")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("users: [{access_key: a}]", "secret_key"),
        ("users: [{access_key: a, secret_key: ''}]", "secret_key"),
        ("users: [{access_key: a, secret_key: s, allow: [{publish: t, subscribe: g}]}]", "either"),
        ("users: [{access_key: a, secret_key: s, allow: [{read: t}]}]", "read"),
        ("users: [{access_key: a, secret_key: sk1}, {access_key: a, secret_key: sk2}]", "twice"),
        ("users: [{access_key: a, secret_key: sk1, admn: true}]", "admn"),
        ("users: [{access_key: 'a b', secret_key: s}]", "access_key"),
        ("users: [", "cannot read"),
        # `topics:` with nothing after it (a typo, or a file read half-written) must not mean
        # "any topic", and an empty file must not silently drop every user.
        (
            "users: [{access_key: a, secret_key: s, allow: [{subscribe: {group: g, topics: }}]}]",
            "topics",
        ),
        (
            "users:\n  - access_key: a\n    secret_key: s\n    allow:\n      - subscribe:\n"
            "          group: g\n          topics:\n",
            "topics",
        ),
        ("", "empty"),
    ],
)
def test_bad_files_are_refused_with_the_reason(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "acl.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=problem) as err:
        load_acl(path)
    assert str(path) in str(err.value)
    assert "sk1" not in str(err.value) and "sk2" not in str(err.value)  # never the secrets


def test_acl_file_reloads_on_change_and_keeps_the_last_good_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    path = tmp_path / "acl.yaml"
    path.write_text(ACL)
    failures: list[int] = []
    source = AclFile(path, clock=lambda: now[0], on_reload_failure=lambda: failures.append(1))
    assert source.current().user("app1") is not None
    path.write_text("users: [{access_key: carol, secret_key: c4r0l-secret}]")
    os.utime(path, ns=(1, 1))
    assert source.current().user("carol") is None  # not checked again within a second
    now[0] = 1.5
    assert source.current().user("carol") is not None and source.current().user("app1") is None
    path.write_text("users: [{access_key: dave}]")  # broken: no secret key
    os.utime(path, ns=(2, 2))
    now[0] = 3.0
    assert source.current().user("carol") is not None  # the last good ACL stays
    assert source.reload_failures == 1 and failures == [1]  # the proxy counts it in a metric
    assert "keeping the previous ACL" in caplog.text and "c4r0l-secret" not in caplog.text


def test_derived_topics_belong_to_their_group_not_to_wildcards(tmp_path: Path) -> None:
    """`subscribe: billing` (any topic) covered `%DLQ%payroll`, and `publish: "*"` every DLQ:
    a group's retry and dead-letter topics now come only with that group, or a grant that
    names them."""
    path = tmp_path / "acl.yaml"
    path.write_text(
        "users:\n"
        "  - access_key: app\n    secret_key: s\n    allow:\n"
        "      - subscribe: billing\n"
        "      - publish: '*'\n"
        "      - subscribe: {group: dlq-reader, topics: ['%DLQ%pay*']}\n"
    )
    app = load_acl(path).user("app")
    assert app is not None
    assert app.can_subscribe("billing", "orders")  # still any user topic
    assert app.can_subscribe("billing", "%DLQ%billing")  # its own dead letters
    assert app.can_subscribe("billing", "%RETRY%billing+orders")
    assert not app.can_subscribe("billing", "%DLQ%payroll")  # another group's
    assert not app.can_subscribe("billing", "%RETRY%payroll+orders")
    assert not app.can_subscribe("billing", "%SYS%TIMER")
    assert not app.can_publish("%DLQ%payroll") and app.can_publish("orders")
    assert app.can_read_topic("%DLQ%billing") and not app.can_read_topic("%DLQ%audit")
    # A grant that names dead-letter topics reaches them, as the group it names.
    assert app.can_subscribe("dlq-reader", "%DLQ%payroll")
    assert app.can_read_topic("%DLQ%payroll")
    assert not app.can_subscribe("dlq-reader", "orders")


def test_a_grant_limited_to_topics_does_not_read_dead_letters_of_other_topics(
    tmp_path: Path,
) -> None:
    """`subscribe: {group: "*", topics: [orders]}` (any group, only orders) read `%DLQ%payroll`
    by consuming as payroll: a group's dead letters hold messages of every topic it consumed
    (payroll's salaries), so a topic-limited grant reached topics it was never given. The
    group's own derived topics now come with a grant only as far as its topics reach."""
    path = tmp_path / "acl.yaml"
    path.write_text(
        "users:\n"
        "  - access_key: app\n    secret_key: s\n    allow:\n"
        "      - subscribe: {group: '*', topics: [orders]}\n"
        "      - subscribe: {group: billing, topics: [invoices, '%DLQ%billing']}\n"
        "      - subscribe: audit\n"
    )
    app = load_acl(path).user("app")
    assert app is not None
    assert app.can_subscribe("payroll", "orders")  # the grant itself still holds
    assert not app.can_subscribe("payroll", "%DLQ%payroll")  # salaries, among others
    assert not app.can_read_topic("%DLQ%payroll")
    assert app.can_subscribe("payroll", "%RETRY%payroll+orders")  # retries of orders only
    assert not app.can_subscribe("payroll", "%RETRY%payroll+salaries")
    assert not app.can_subscribe("payroll", "%RETRY%payroll+%DLQ%payroll")
    # named dead letters, and a grant on every topic, still reach the group's own
    assert app.can_subscribe("billing", "%DLQ%billing")
    assert app.can_subscribe("billing", "%RETRY%billing+%DLQ%billing")
    assert app.can_subscribe("audit", "%DLQ%audit") and app.can_read_topic("%DLQ%audit")
    assert app.can_subscribe("audit", "%RETRY%audit+%DLQ%audit")


def test_a_grant_reaches_one_namespace_and_no_wildcard_crosses_it(tmp_path: Path) -> None:
    """Behind the edge a namespaced name is `ns%name`: `publish: "prod*"` matched every topic,
    group and dead letter of namespace prod. The namespace is now a part of the grant."""
    path = tmp_path / "acl.yaml"
    path.write_text(
        """
users:
  - access_key: plain
    secret_key: s
    allow:
      - publish: "prod*"
      - subscribe: "*"
  - access_key: prod
    secret_key: s
    allow:
      - {publish: "orders-*", namespace: prod}
      - {subscribe: billing, namespace: prod}
      - {subscribe: {group: audit, topics: ["%DLQ%billing"]}, namespace: prod}
"""
    )
    acl = load_acl(path)
    plain, prod = acl.user("plain"), acl.user("prod")
    assert plain is not None and prod is not None
    assert plain.can_publish("prod-orders")
    assert not plain.can_publish("prod%orders")  # True before: `*` matched the `%`
    assert not plain.can_subscribe("prod%billing", "prod%orders")
    assert not plain.can_read_topic("%DLQ%prod%billing")
    assert prod.can_publish("prod%orders-1") and not prod.can_publish("orders-1")
    assert not prod.can_publish("staging%orders-1") and not prod.can_publish("prod%x%orders-1")
    assert prod.can_subscribe("prod%billing", "prod%orders")
    assert not prod.can_subscribe("prod%billing", "orders") and not prod.can_subscribe("billing")
    assert prod.can_subscribe("prod%billing", "%RETRY%prod%billing+prod%orders")
    assert prod.can_subscribe("prod%billing", "%DLQ%prod%billing")
    assert not prod.can_subscribe("prod%billing", "%RETRY%prod%billing+staging%orders")
    assert prod.can_subscribe("prod%audit", "%DLQ%prod%billing")
    assert not prod.can_subscribe("prod%audit", "%DLQ%billing")
    assert prod.can_read_topic("prod%orders-1") and not prod.can_read_topic("orders-1")


NAMESPACE_RULE = r"1 to 64 characters, each a letter, a digit, '_' or '-'"


@pytest.mark.parametrize(
    ("grant", "problem"),
    [
        ("{publish: 'prod%orders'}", "namespace: NS"),
        ("{subscribe: {group: 'prod%g'}}", "namespace: NS"),
        ("{subscribe: {group: g, topics: ['%DLQ%prod%g']}}", "namespace: NS"),
        ("{publish: t, namespace: 'pr*'}", NAMESPACE_RULE),
        ("{publish: t, namespace: ''}", NAMESPACE_RULE),
        ("{publish: t, namespace: 'prod%eu'}", NAMESPACE_RULE),
        (f"{{publish: t, namespace: {'x' * 65}}}", NAMESPACE_RULE),
        ("{publish: t, namespace: 7}", NAMESPACE_RULE),
    ],
)
def test_namespaces_in_grants_are_checked(tmp_path: Path, grant: str, problem: str) -> None:
    path = tmp_path / "acl.yaml"
    path.write_text(f"users: [{{access_key: a, secret_key: s, allow: [{grant}]}}]")
    with pytest.raises(ValueError, match=problem) as refused:
        load_acl(path)
    # what a namespace may hold, where it is, and not pydantic's raw regular expression
    assert "users.0.allow.0.namespace" in str(refused.value) or "namespace: NS" in problem
    assert "pattern" not in str(refused.value).replace("not a pattern", "")


def test_a_valid_namespace_loads(tmp_path: Path) -> None:
    path = tmp_path / "acl.yaml"
    path.write_text(
        "users: [{access_key: a, secret_key: s, allow: [{publish: t, namespace: p-1_X}]}]"
    )
    assert load_acl(path).users[0].allow[0].namespace == "p-1_X"


def test_subscribe_decisions_are_remembered_per_user_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every consuming call asks; the grants of one User never change, so its answers are
    # remembered (a reload makes new Users), never shared with another user or grown unbounded.
    from popmq.security import acl as acl_module

    monkeypatch.setattr(acl_module, "_DECISIONS_KEPT", 4)
    grant = {"subscribe": {"group": "g", "topics": ["t"]}}
    user = User(access_key="a", secret_key="s", allow=(grant,))
    other = User(access_key="b", secret_key="s")
    for _ in range(2):
        assert user.can_subscribe("g", "t") and user.can_subscribe("g")
        assert not user.can_subscribe("g", "x") and not user.can_subscribe("h", "t")
        assert not other.can_subscribe("g", "t")
    for topic in range(10):  # made-up names evict; answers stay right
        assert not user.can_subscribe("g", f"made-up-{topic}")
    assert len(user.__dict__["_subscribe_memo"]) <= 4
    assert user.can_subscribe("g", "t")
    assert user == User(access_key="a", secret_key="s", allow=(grant,))  # fields only
