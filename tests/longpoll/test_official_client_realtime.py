"""The official Python client receives in real time from a 4-broker `popmq serve`.

Each round the SimpleConsumer is already long-polling (awaitDuration 5 s) when one message is
sent; the producer's queue choice puts it on any of the four brokers. With the default
(adaptive, quiet, so pop with notify) it must arrive within milliseconds, not at the end of
the poll: under plain pop long polling three rounds in four would wait the whole 5 s.
"""

from __future__ import annotations

import importlib.util
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.client

ROUNDS = 6
SETTLE_S = 0.7  # the consumer's receive is on the proxy by then


def _client_support() -> ModuleType:
    """tests/client/official_client_support.py (that folder is not a package)."""
    name = "official_client_support"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "client" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_official_client_receives_in_real_time_from_four_brokers(tmp_path: Path) -> None:
    support = _client_support()
    if not support.CLIENT_PYTHON.exists():
        pytest.fail("the official client venv is missing: run `make client-venv`")
    server = support.serve(tmp_path / "data", brokers=4)
    sessions = []
    try:
        endpoint = f"127.0.0.1:{server.wait_listening()}"
        topic, group = f"rt-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
        producer = support.ClientSession(
            {"endpoint": endpoint, "role": "producer", "topics": [topic]}, tmp_path
        )
        sessions.append(producer)
        consumer = support.ClientSession(
            {"endpoint": endpoint, "role": "simple", "topics": [topic], "group": group,
             "await_s": 5},
            tmp_path,
        )  # fmt: skip
        sessions.append(consumer)
        latencies = []
        queues = set()
        with ThreadPoolExecutor(max_workers=1) as pool:
            for index in range(ROUNDS):
                waiting = pool.submit(consumer.call, "receive", max=16, invisible_s=15)
                time.sleep(SETTLE_S)
                sent = producer.call("send", messages=[{"body": f"realtime-{index}"}])
                assert sent["ok"] and sent["results"][0]["ok"], sent
                queues.add(sent["results"][0]["queue"])
                answer = waiting.result(timeout=20)
                assert answer["ok"], answer
                assert [m["body"] for m in answer["messages"]] == [f"realtime-{index}"]
                message = answer["messages"][0]
                latencies.append(message["received_at_ms"] - message["born_timestamp"])
                # held only until the message came, not for the 5 s awaitDuration
                assert answer["elapsed_s"] < SETTLE_S + 1.5, answer["elapsed_s"]
                assert consumer.call("ack", id=message["message_id"])["ok"]
        assert len(queues) > 1  # the messages really went to different queues
        assert max(latencies) < 1_000, latencies  # send + delivery, milliseconds in practice
    finally:
        for session in sessions:
            session.close()
        assert server.stop() == 0
