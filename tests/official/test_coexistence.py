"""popmq and the official rocketmq-python-client in one interpreter (issue 13, item 1).

Both register `apache.rocketmq.v2` protocol types; popmq keeps its own in a private
DescriptorPool (popmq/pb/pool.py), so either import order works and both talk to a popmq server
from the same process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.official_clients import Deployment, unique

JOB = Path(__file__).with_name("coexist_job.py")

pytestmark = [pytest.mark.client, pytest.mark.slow]


@pytest.mark.parametrize("order", ["official-first", "popmq-first"])
def test_official_producer_and_popmq_client_in_one_process(
    serve_deployment: Deployment, order: str, tmp_path: Path
) -> None:
    topic = unique("coexist")
    env = dict(os.environ, HOME=str(tmp_path))  # the official client logs under ~/logs
    done = subprocess.run(
        [sys.executable, str(JOB), serve_deployment.endpoint, topic, order],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer == {"ok": True, "body": f"hello from {order}", "message_id": answer["message_id"]}
    assert answer["message_id"]


def test_popmq_keeps_its_protocol_types_out_of_the_default_pool() -> None:
    """The mechanism, checked directly: importing popmq's protocol code registers nothing under
    apache.rocketmq.v2 in protobuf's default pool (which the official client fills)."""
    code = (
        "from google.protobuf import descriptor_pool\n"
        "import popmq.pb.rocketmq.v2.service_pb2, popmq.pb.admin.v1.admin_pb2\n"
        "import popmq.pb.broker.v1.broker_pb2, popmq.proxy.server, popmq.client\n"
        "try:\n"
        "    descriptor_pool.Default().FindMessageTypeByName('apache.rocketmq.v2.Resource')\n"
        "except KeyError:\n"
        "    print('absent')\n"
        "else:\n"
        "    print('present')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "absent"
