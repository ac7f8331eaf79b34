"""One interpreter that imports the official rocketmq client and popmq (in the order given),
sends with the official Producer and reads the message back with popmq.client.

Usage: python tests/official/coexist_job.py ENDPOINT TOPIC official-first|popmq-first
Prints one JSON line: {"ok": true, "body": "...", "message_id": "..."} or raises.
"""

from __future__ import annotations

import importlib
import json
import sys
import time


def import_both(order: str) -> None:
    names = ["rocketmq", "popmq.client", "popmq.pb.rocketmq.v2.service_pb2", "popmq.spark"]
    if order == "popmq-first":
        names = names[1:] + names[:1]
    for name in names:
        importlib.import_module(name)


def main(endpoint: str, topic: str, order: str) -> None:
    import_both(order)
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    from popmq.client import Client

    producer = Producer(ClientConfiguration(endpoint, Credentials("", ""), ""), (topic,))
    producer.startup()
    try:
        message = Message()
        message.topic = topic
        message.body = f"hello from {order}".encode()
        receipt = producer.send(message)
    finally:
        producer.shutdown()

    deadline = time.monotonic() + 30
    with Client(endpoint) as client:
        while time.monotonic() < deadline:
            for queue in client.query_route(topic):
                for found in client.pull(queue, offset=0).messages:
                    if found.message_id == receipt.message_id:
                        print(json.dumps({"ok": True, "body": found.body.decode(),
                                          "message_id": found.message_id}))  # fmt: skip
                        return
            time.sleep(0.2)
    raise SystemExit(f"message {receipt.message_id} not found through popmq.client")


if __name__ == "__main__":
    main(*sys.argv[1:4])
