"""`helm test`: send a message through the proxy Service, receive it and ack it.

Run in the popmq image by the chart's test pod (templates/tests/send-receive.yaml). Reads the
endpoint from ENDPOINT, an admin user's keys from the ACL file when auth is on, and the CA
when TLS is on. Exit 0 only when the message came back and the ack was accepted.
"""

import os
import sys
import time
import uuid
from pathlib import Path

import yaml
from popmq.broker.contract.types import Message

from popmq.client import Client
from popmq.client.security import ClientSecurity


def security() -> ClientSecurity | None:
    acl = Path(os.environ.get("ACL_FILE", "/var/run/popmq/acl/acl.yaml"))
    ca = Path(os.environ.get("CA_FILE", "/var/run/popmq/tls/ca.crt"))
    keys: dict[str, str] = {}
    if acl.exists():
        users = yaml.safe_load(acl.read_text()).get("users", [])
        admin = next(u for u in users if u.get("admin"))
        keys = {"access_key": admin["access_key"], "secret_key": admin["secret_key"]}
    if not keys and not ca.exists():
        return None
    return ClientSecurity(**keys, tls=ca.exists(), ca_file=ca if ca.exists() else None)


def main() -> int:
    endpoint = os.environ["ENDPOINT"]
    run = uuid.uuid4().hex[:8]
    topic, group, body = f"helm-test-{run}", f"helm-test-{run}", f"ping {run}".encode()
    with Client(endpoint, security=security()) as client:
        (sent,) = client.send([Message(topic, body)])
        print(f"sent {sent.message_id} to {topic} through {endpoint}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for queue in client.query_route(topic):
                for got in client.receive(group, queue, batch_size=1, long_polling_ms=1000):
                    if got.body != body:
                        continue
                    (outcome,) = client.ack(group, topic, [(got.message_id, got.receipt_handle)])
                    verdict = "accepted" if outcome.ok else "refused"
                    print(f"received {got.message_id}; ack {verdict}")
                    return 0 if outcome.ok else 1
        print("the message did not come back within 60 s", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
