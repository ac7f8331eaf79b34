"""Server-side queue assignment for push consumers (seed 002).

POP groups use allocate4Pop: with popShareQueueNum = N each consumer takes its own average
share plus the shares of the N consumers after it, so every queue has N + 1 consumers; when N
is 0 or covers everyone, every consumer gets every broker (queue id -1: "pop all queues").
PULL groups get an exclusive average share (AllocateMessageQueueAveragely), for consumers that
pull by offset. The group members are the consumers this proxy has heard from.
"""

from __future__ import annotations

from popmq.proxy.cluster import QueueRef

ALL_QUEUES = -1


def allocate_averagely(client: str, queues: list[QueueRef], clients: list[str]) -> list[QueueRef]:
    """RocketMQ's AllocateMessageQueueAveragely: contiguous, near-equal shares in order."""
    if client not in clients or not queues:
        return []
    index, n_queues, n_clients = clients.index(client), len(queues), len(clients)
    mod = n_queues % n_clients
    if n_queues <= n_clients:
        size = 1
    elif mod > 0 and index < mod:
        size = n_queues // n_clients + 1
    else:
        size = n_queues // n_clients
    start = index * size if mod > 0 and index < mod else index * size + mod
    count = min(size, n_queues - start)
    return [queues[(start + i) % n_queues] for i in range(max(count, 0))]


def allocate_for_pop(
    client: str, queues: list[QueueRef], clients: list[str], share_queue_num: int
) -> list[QueueRef]:
    """RocketMQ's allocate4Pop. Returns (broker, ALL_QUEUES) entries when every consumer
    reads everything."""
    if share_queue_num <= 0 or share_queue_num >= len(clients) - 1:
        brokers = dict.fromkeys(q.broker for q in queues)
        return [QueueRef(broker, ALL_QUEUES) for broker in brokers]
    if client not in clients:  # e.g. registered as a producer: no share (as averagely)
        return []
    if len(clients) <= len(queues):
        result = allocate_averagely(client, queues, clients)
        index = clients.index(client)
        for _ in range(share_queue_num):
            index = (index + 1) % len(clients)
            result.extend(allocate_averagely(clients[index], queues, clients))
        return list(dict.fromkeys(result))
    # More consumers than queues: each consumer one queue, queues shared round robin.
    return [queues[clients.index(client) % len(queues)]]
