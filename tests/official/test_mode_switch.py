"""POP <-> PULL switching of a consumer group (issue 13, item 6; seed 000).

`popmq admin set-consume-mode GROUP POP|PULL` switches how QueryAssignment hands the group's
queues to its PushConsumers (PULL: exclusive averaged shares; POP: allocate4Pop, shared). Both
modes read the same broker state, so a switch loses nothing: the group's consumer offsets carry
over, and messages waiting for a retry in the old mode are consumed in the new one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
from support.official_clients import Deployment, unique

pytestmark = [pytest.mark.client, pytest.mark.slow]


def _admin(endpoint: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "popmq", "admin", "--endpoint", endpoint, "--json", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _send(open_client, endpoint: str, topic: str, bodies: list[str]) -> None:  # type: ignore[no-untyped-def]
    producer = open_client(endpoint, "producer", topics=[topic])
    answer = producer.call("send", topic=topic, messages=[{"body": b} for b in bodies])
    assert answer["ok"] and all(r["ok"] for r in answer["results"]), answer
    producer.close()


def _successes(consumer, count: int) -> list[dict]:  # type: ignore[no-untyped-def]
    consumed = consumer.call("push_collect", count=count, timeout_s=60)["consumed"]
    return [r for r in consumed if r["result"] == "SUCCESS"]


def test_switching_a_group_between_pull_and_pop_keeps_offsets_and_retries(
    serve_deployment: Deployment, open_client
) -> None:  # type: ignore[no-untyped-def]
    endpoint = serve_deployment.endpoint
    topic, group = unique("switch"), unique("g")
    _admin(endpoint, "groups", "set", group, "--consume-mode", "PULL", "--max-attempts", "50")

    # PULL mode: a consumer that fails every message once it starts, then goes away, so the
    # batch waits for its retry when the group switches.
    first = [f"first-{i}" for i in range(6)]
    _send(open_client, endpoint, topic, first)
    failing = open_client(endpoint, "push", topics=[topic], group=group, fail_attempts=1000)
    started = failing.call("push_started", count=len(first), timeout_s=60)["started"]
    assert len(set(started)) == len(first)
    failing.close()

    assert _admin(endpoint, "set-consume-mode", group, "POP")["group"]["consume_mode"] == "POP"
    second = [f"second-{i}" for i in range(4)]
    _send(open_client, endpoint, topic, second)
    pop = open_client(endpoint, "push", topics=[topic], group=group)
    done = _successes(pop, len(first) + len(second))
    bodies = Counter(r["body"] for r in done)
    assert sorted(bodies) == sorted(first + second) and set(bodies.values()) == {1}
    # The PULL-mode failures came back as retries and were consumed in POP mode.
    assert all(r["delivery_attempt"] >= 2 for r in done if r["body"].startswith("first"))
    pop.close()

    # And back: the offsets carry over (nothing consumed before is read again); a failure in
    # PULL mode is retried there.
    assert _admin(endpoint, "set-consume-mode", group, "PULL")["group"]["consume_mode"] == "PULL"
    third = [f"third-{i}" for i in range(3)]
    _send(open_client, endpoint, topic, third)
    pull = open_client(endpoint, "push", topics=[topic], group=group, fail_attempts=1)
    consumed = pull.call("push_collect", count=len(third), timeout_s=60)["consumed"]
    assert {r["body"] for r in consumed} == set(third)
    succeeded = [r for r in consumed if r["result"] == "SUCCESS"]
    assert sorted(r["body"] for r in succeeded) == third
    assert {r["delivery_attempt"] for r in succeeded} == {2}
