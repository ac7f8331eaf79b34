"""A small client of the proxy's apache.rocketmq.v2 protocol (async and blocking).

Not a replacement for the official RocketMQ clients: no telemetry, no heartbeats, no
retries of sends. It is what popmq's own tools need: routes, offsets, pull by offset,
send, and POP receive / ack / change invisible duration.

    from popmq.client import Client
    with Client("127.0.0.1:8081") as client:
        queues = client.query_route("orders")
        batch = client.pull(queues[0], offset=0)
"""

from popmq.client.aio import AsyncClient
from popmq.client.errors import ProxyError, ProxyTimeout, ProxyUnavailable
from popmq.client.model import (
    AckOutcome,
    OffsetPolicy,
    PullResult,
    QueueRef,
    ReceivedMessage,
    SendReceipt,
)
from popmq.client.sync import Client, PendingSend

__all__ = [
    "AckOutcome",
    "AsyncClient",
    "Client",
    "OffsetPolicy",
    "PendingSend",
    "ProxyError",
    "ProxyTimeout",
    "ProxyUnavailable",
    "PullResult",
    "QueueRef",
    "ReceivedMessage",
    "SendReceipt",
]
