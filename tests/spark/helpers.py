"""Producing and checking messages through popmq.client, outside Spark."""

from __future__ import annotations

import time

from popmq.broker.contract.types import Message

from popmq.client import Client, OffsetPolicy, ReceivedMessage


def produce(
    endpoint: str, topic: str, count: int, prefix: str = "m", per_request: int = 5
) -> list[str]:
    """Send `count` messages (bodies prefix-0, prefix-1, ...); returns their message ids.

    Small requests, so the proxy's round robin spreads them over every queue."""
    ids: list[str] = []
    with Client(endpoint) as client:
        for first in range(0, count, per_request):
            batch = [
                Message(
                    topic=topic,
                    body=f"{prefix}-{i}".encode(),
                    tag="even" if i % 2 == 0 else "odd",
                    keys=[f"key-{prefix}-{i}"],
                    properties={"n": str(i)},
                )
                for i in range(first, min(first + per_request, count))
            ]
            ids += [receipt.message_id for receipt in client.send(batch)]
    return ids


def read_everything(endpoint: str, topic: str) -> list[ReceivedMessage]:
    """Every message of the topic, pulled queue by queue from its first offset."""
    messages: list[ReceivedMessage] = []
    with Client(endpoint) as client:
        queues = client.query_route(topic)
        ends = client.query_offsets(queues, OffsetPolicy.END)
        for queue in queues:
            offset = client.query_offset(queue, OffsetPolicy.BEGINNING)
            while offset < ends[queue.key]:
                result = client.pull(queue, offset)
                messages += result.messages
                offset = result.next_offset
    return messages


def end_offsets(endpoint: str, topic: str) -> dict[tuple[str, int], int]:
    with Client(endpoint) as client:
        return client.query_offsets(client.query_route(topic), OffsetPolicy.END)


def group_offsets(endpoint: str, topic: str, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets (queues it never committed on count as 0)."""
    with Client(endpoint) as client:
        return {q.key: max(client.get_offset(group, q), 0) for q in client.query_route(topic)}


def receive_all(
    endpoint: str,
    topic: str,
    group: str,
    wait_s: float,
    expected: int | None = None,
    invisible_ms: int = 60_000,
) -> list[ReceivedMessage]:
    """Pop what is visible for the group (through every broker) until `expected` messages
    came or wait_s passed."""
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + wait_s
    with Client(endpoint) as client:
        queues = client.query_route(topic)
        brokers = {q.broker: q for q in queues}
        while time.monotonic() < deadline and (expected is None or len(got) < expected):
            round_got = []
            for queue in brokers.values():
                round_got += client.receive(
                    group, queue, invisible_ms=invisible_ms, long_polling_ms=100
                )
            got += round_got
    return got
