"""Server-side queue assignment: AllocateMessageQueueAveragely and allocate4Pop (seed 002)."""

from __future__ import annotations

from collections import Counter

import pytest
from popmq.proxy.cluster import QueueRef
from popmq.proxy.core.assignment import ALL_QUEUES, allocate_averagely, allocate_for_pop

QUEUES = [QueueRef(b, q) for b in ("broker-0", "broker-1") for q in range(4)]  # 8 queues


def test_averagely_partitions_queues_exactly_once() -> None:
    clients = ["c1", "c2", "c3"]
    shares = [allocate_averagely(c, QUEUES, clients) for c in clients]
    assert [len(s) for s in shares] == [3, 3, 2]
    assert sorted(q for share in shares for q in share) == sorted(QUEUES)


def test_averagely_more_clients_than_queues_leaves_some_idle() -> None:
    clients = [f"c{i:02d}" for i in range(10)]
    shares = [allocate_averagely(c, QUEUES, clients) for c in clients]
    assert sum(len(s) for s in shares) == len(QUEUES)
    assert all(len(s) <= 1 for s in shares)


def test_averagely_unknown_client_gets_nothing() -> None:
    assert allocate_averagely("stranger", QUEUES, ["c1"]) == []


@pytest.mark.parametrize("share", [0, 3, 10])
def test_pop_everyone_reads_everything_when_sharing_covers_all(share: int) -> None:
    clients = ["c1", "c2", "c3", "c4"]
    for client in clients:
        chosen = allocate_for_pop(client, QUEUES, clients, share)
        assert chosen == [QueueRef("broker-0", ALL_QUEUES), QueueRef("broker-1", ALL_QUEUES)]


def test_pop_share_one_gives_each_queue_two_consumers() -> None:
    clients = ["c1", "c2", "c3", "c4"]
    per_client = {c: allocate_for_pop(c, QUEUES, clients, 1) for c in clients}
    owners = Counter(q for chosen in per_client.values() for q in chosen)
    assert set(owners) == set(QUEUES)
    assert set(owners.values()) == {2}  # popShareQueueNum + 1 consumers per queue
    # a client's own share comes first, then its neighbour's
    assert per_client["c1"][:2] == allocate_averagely("c1", QUEUES, clients)


def test_pop_more_consumers_than_queues_one_queue_each() -> None:
    clients = [f"c{i:02d}" for i in range(12)]
    chosen = [allocate_for_pop(c, QUEUES, clients, 1) for c in clients]
    assert all(len(c) == 1 for c in chosen)
    assert {q for c in chosen for q in c} == set(QUEUES)


@pytest.mark.parametrize("consumers", [3, 12])  # fewer and more consumers than queues
def test_pop_share_for_a_caller_outside_the_group_is_empty(consumers: int) -> None:
    """Issue 20, defect 9: a caller registered as a producer asking for a group of 3 or more
    consumers raised ValueError (answered INTERNAL_ERROR); it gets no share, as averagely."""
    clients = [f"c{i:02d}" for i in range(consumers)]
    assert allocate_for_pop("producer-1", QUEUES, clients, share_queue_num=1) == []
