"""The client registry: soft state refreshed by heartbeats, expired by silence."""

from __future__ import annotations

from popmq.proxy.registry import ClientRegistry

from popmq.clock import ManualClock


class Clock(ManualClock):
    """Wall seconds moved by hand (``now``)."""

    def __init__(self) -> None:
        super().__init__(1_000.0)

    @property
    def now(self) -> float:
        return self.now_s

    @now.setter
    def now(self, value: float) -> None:
        self.now_s = value


def test_members_by_group_and_topic_and_expiry() -> None:
    clock = Clock()
    registry = ClientRegistry(expiry_s=30, clock=clock)
    registry.touch("b", client_type="PUSH_CONSUMER", group="g", topics={"t1"})
    registry.touch("a", client_type="SIMPLE_CONSUMER", group="g", topics={"t1", "t2"})
    registry.touch("p", client_type="PRODUCER", topics={"t1"})
    registry.touch("c", client_type="PUSH_CONSUMER", group="other", topics={"t1"})
    assert registry.group_members("g", "t1") == ["a", "b"]
    assert registry.group_members("g", "t2") == ["a"]
    clock.now += 20
    registry.touch("a")  # a heartbeat keeps a alive, keeps what it said before
    clock.now += 15
    assert registry.group_members("g") == ["a"]
    assert registry.get("a").topics == {"t1", "t2"}
    registry.remove("a")
    assert registry.clients("g") == []


def test_the_same_id_under_two_access_keys_is_two_clients() -> None:
    registry = ClientRegistry(expiry_s=30, clock=Clock())
    registry.touch("c1", client_type="PUSH_CONSUMER", group="g", access_key="alice")
    registry.touch("c1", client_type="PRODUCER", group="x", access_key="mallory")
    registry.touch("c2", client_type="PUSH_CONSUMER", group="g")  # no authentication
    alice = registry.get("c1", "alice")
    assert alice is not None and alice.group == "g" and alice.client_type == "PUSH_CONSUMER"
    assert registry.get("c1") is None  # nobody registered c1 without a key
    assert registry.group_members("g") == ["c1|alice", "c2"]
    registry.remove("c1", "mallory")
    assert registry.get("c1", "alice") is alice


def test_lookups_sweep_the_table_at_most_once_a_second() -> None:
    """Every lookup (each heartbeat, receive and assignment makes one) swept the whole table:
    with many client ids, which any caller can add, every request paid for all of them
    (20,000 ids: 0.4 ms a lookup; registering them took 5 s, quadratic)."""
    clock = Clock()
    registry = ClientRegistry(expiry_s=30, clock=clock)
    for i in range(1_000):
        registry.touch(f"id-{i}", client_type="PUSH_CONSUMER", group="g", access_key="k")
    assert registry.sweeps == 1  # all within one second of virtual time
    clock.now += 29.9
    registry.touch("id-0", access_key="k")  # a heartbeat keeps it alive (and sweeps: none due)
    assert registry.sweeps == 2
    clock.now += 0.6  # the others are past their expiry, within the sweep's second
    assert registry.get("id-1", "k") is None  # expired, though not swept yet
    assert registry.get("id-0", "k") is not None
    assert registry.group_members("g") == ["id-0|k"]
    assert registry.sweeps == 2
    assert registry.touch("id-1", access_key="k").first_seen == clock.now  # a new entry
    clock.now += 1
    registry.get("id-0", "k")
    assert registry.sweeps == 3 and len(registry.clients()) == 2


def test_clients_per_access_key_are_bounded() -> None:
    """Any signed-in user could register client ids without end (each an entry, and a member
    of queue assignment): past proxy.max_clients_per_access_key, TOO_MANY_REQUESTS."""
    import pytest
    from popmq.broker.contract.errors import Code, RefusedError

    clock = Clock()
    refused: list[int] = []
    registry = ClientRegistry(
        expiry_s=30, clock=clock, max_per_access_key=2, on_refused=lambda: refused.append(1)
    )
    registry.touch("a", access_key="app")
    registry.touch("b", access_key="app")
    registry.touch("a", access_key="app")  # a known id: a refresh, not one more
    with pytest.raises(RefusedError) as caught:
        registry.touch("c", access_key="app")
    assert caught.value.code == Code.TOO_MANY_REQUESTS
    assert "max_clients_per_access_key" in str(caught.value) and refused == [1]
    registry.touch("c", access_key="other")  # another user's own count
    for i in range(5):
        registry.touch(f"open-{i}")  # no ACL, no access key: not limited here
    registry.remove("b", access_key="app")
    registry.touch("c", access_key="app")
    clock.now += 31  # both silent past the expiry: their places are free again
    registry.touch("d", access_key="app")
    registry.touch("e", access_key="app")
    assert {c.client_id for c in registry.clients() if c.access_key == "app"} == {"d", "e"}
