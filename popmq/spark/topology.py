"""Driver-side look-ups: the topic's queues, with errors a Spark user can act on."""

from __future__ import annotations

from popmq.broker.contract.errors import Code
from popmq.client import Client, ProxyError, ProxyUnavailable, QueueRef
from popmq.errors import PopmqError
from popmq.spark.options import Connection


class TopicNotFoundError(PopmqError, LookupError):
    """The topic does not exist, or has no readable queue."""

    code = Code.TOPIC_NOT_FOUND


def connect(connection: Connection) -> Client:
    return Client(connection.endpoint, connection.timeout_ms / 1000, security=connection.security)


def readable_queues(client: Client, topic: str) -> list[QueueRef]:
    """The topic's readable queues, sorted by (broker, id)."""
    try:
        queues = client.query_route(topic)
    except ProxyUnavailable as error:
        raise ConnectionError(
            f"popmq: cannot reach the proxy at {client.endpoint} (option 'endpoint'): "
            f"{error.message}"
        ) from error
    except ProxyError as error:
        if error.code in (Code.TOPIC_NOT_FOUND, Code.NOT_FOUND):
            raise TopicNotFoundError(
                f"popmq: topic {topic!r} does not exist at {client.endpoint} ({error.message})"
            ) from error
        if error.code == Code.ILLEGAL_TOPIC:
            message = f"popmq: option 'topic'={topic!r} is invalid: {error.message}"
            raise ValueError(message) from error
        raise
    readable = [q for q in queues if q.readable]
    if not readable:
        raise TopicNotFoundError(f"popmq: topic {topic!r} has no readable queue")
    return readable


def brokers_of(queues: list[QueueRef]) -> list[QueueRef]:
    """One route entry per broker (its lowest queue): pop requests name a broker this way."""
    first: dict[str, QueueRef] = {}
    for queue in queues:
        first.setdefault(queue.broker, queue)
    return [first[name] for name in sorted(first)]
