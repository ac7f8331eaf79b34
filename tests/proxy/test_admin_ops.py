"""The mqadmin-level admin verbs against a real proxy over real brokers: consumer progress,
offset reset by time, message query, DLQ list and resend, topic route, cluster status."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from popmq.broker.contract.errors import Code
from proxy_support import Cluster, unique

from popmq.pb.admin.v1 import admin_pb2 as a
from popmq.pb.admin.v1 import admin_pb2_grpc
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

# One cluster for the module's checks (each uses its own topics and groups); the few that
# need their own configuration make one on the test's own loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")
OWN_CLUSTER = pytest.mark.asyncio(loop_scope="function")


@pytest.fixture(scope="module")
def cluster(module_cluster: Cluster) -> Cluster:
    return module_cluster


def _admin(cluster: Cluster) -> admin_pb2_grpc.AdminServiceStub:
    return admin_pb2_grpc.AdminServiceStub(cluster.channel)


async def _topic(cluster: Cluster, queues: int = 1) -> str:
    topic = unique("ops")
    created = await _admin(cluster).CreateTopic(
        a.CreateTopicRequest(name=topic, queue_count=queues)
    )
    assert created.status.code == Code.OK
    return topic


async def test_consumer_progress_lag_and_latency(cluster: Cluster) -> None:
    admin = _admin(cluster)
    topic, group = await _topic(cluster), unique("g")
    await cluster.send(topic, b"a", b"b", b"c", b"d")
    _, received, _ = await cluster.receive(group, topic, batch=1)
    await cluster.ack(group, topic, *received)
    _, inflight, _ = await cluster.receive(group, topic, batch=1)
    await asyncio.sleep(0.05)  # the oldest un-acked message gets an age
    progress = await admin.ConsumerProgress(a.ConsumerProgressRequest(group=group))
    assert progress.status.code == Code.OK
    rows = [q for q in progress.queues if q.topic == topic]
    assert sum(q.lag for q in rows) == 3  # 4 sent, 1 acked
    assert sum(q.inflight for q in rows) == len(inflight) == 1
    assert max(q.lag_latency_ms for q in rows) >= 50
    # a group that never consumed shows nothing without --topic
    none = await admin.ConsumerProgress(a.ConsumerProgressRequest(group=unique("idle")))
    assert [q for q in none.queues if q.topic == topic] == []
    bad = await admin.ConsumerProgress(a.ConsumerProgressRequest(group="bad group"))
    assert bad.status.code == Code.ILLEGAL_CONSUMER_GROUP


async def _drain(cluster: Cluster, group: str, topic: str, want: int) -> list[bytes]:
    """Receive (and ack) until `want` messages came, from whichever broker holds them."""
    bodies: list[bytes] = []
    for _ in range(20):
        status, got, _ = await cluster.receive(group, topic, poll_ms=300)
        assert status.code in (Code.OK, Code.MESSAGE_NOT_FOUND), status
        if got:
            await cluster.ack(group, topic, *got)
        bodies += [m.body for m in got]
        if len(bodies) >= want:
            break
    return sorted(bodies)


async def test_reset_offsets_by_time_earliest_latest(cluster: Cluster) -> None:
    admin = _admin(cluster)
    topic, group = await _topic(cluster), unique("g")
    await cluster.send(topic, b"old-1", b"old-2")
    await asyncio.sleep(0.05)
    cut = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    await cluster.send(topic, b"new-1")

    latest = await admin.ResetOffset(a.ResetOffsetRequest(group=group, topic=topic, latest=True))
    assert latest.status.code == Code.OK
    assert sum(q.new_offset for q in latest.queues) == 3
    _, got, _ = await cluster.receive(group, topic, poll_ms=0)
    assert got == []

    by_time = await admin.ResetOffset(
        a.ResetOffsetRequest(group=group, topic=topic, timestamp_ms=cut)
    )
    assert sum(q.new_offset for q in by_time.queues) == 2
    assert await _drain(cluster, group, topic, 1) == [b"new-1"]

    earliest = await admin.ResetOffset(
        a.ResetOffsetRequest(group=group, topic=topic, earliest=True)
    )
    assert [q.new_offset for q in earliest.queues] == [0, 0]  # one queue on each broker
    assert await _drain(cluster, group, topic, 3) == [b"new-1", b"old-1", b"old-2"]

    missing = await admin.ResetOffset(a.ResetOffsetRequest(group=group, topic=topic))
    assert missing.status.code == Code.BAD_REQUEST
    nope = await admin.ResetOffset(
        a.ResetOffsetRequest(group=group, topic=unique("nope"), latest=True)
    )
    assert nope.status.code == Code.TOPIC_NOT_FOUND


async def test_query_messages_by_id_and_key(cluster: Cluster) -> None:
    admin = _admin(cluster)
    topic = await _topic(cluster, queues=2)
    sent = await cluster.send(topic, b"one", keys=["order-1"])
    await cluster.send(topic, b"two", keys=["order-2"])
    message_id = sent.entries[0].message_id
    by_id = await admin.QueryMessages(a.QueryMessagesRequest(message_id=message_id))
    assert by_id.status.code == Code.OK
    assert [(m.message_id, m.topic, list(m.keys)) for m in by_id.messages] == [
        (message_id, topic, ["order-1"])
    ]
    by_key = await admin.QueryMessages(
        a.QueryMessagesRequest(topic=topic, key="order-2", include_body=True)
    )
    assert [m.body for m in by_key.messages] == [b"two"]
    empty = await admin.QueryMessages(a.QueryMessagesRequest(topic=topic, key="none"))
    assert empty.status.code == Code.OK and not empty.messages
    bad = await admin.QueryMessages(a.QueryMessagesRequest(topic=topic))
    assert bad.status.code == Code.BAD_REQUEST


async def test_dlq_list_and_resend(cluster: Cluster) -> None:
    admin = _admin(cluster)
    topic, group = await _topic(cluster), unique("g")
    await cluster.send(topic, b"poison", b"fine")
    _, received, _ = await cluster.receive(group, topic, batch=2)
    poison = next(m for m in received if m.body == b"poison")
    fine = next(m for m in received if m.body == b"fine")
    await cluster.ack(group, topic, fine)
    forwarded = await cluster.stub.ForwardMessageToDeadLetterQueue(
        s.ForwardMessageToDeadLetterQueueRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name=topic),
            receipt_handle=poison.system_properties.receipt_handle,
            message_id=poison.system_properties.message_id, delivery_attempt=1,
            max_delivery_attempts=16,
        ), metadata=cluster.metadata(),
    )  # fmt: skip
    assert forwarded.status.code == Code.OK
    poison_id = poison.system_properties.message_id

    listed = await admin.ListDlq(a.ListDlqRequest(group=group))
    assert listed.status.code == Code.OK and listed.total == 1
    [dead] = listed.messages
    assert (dead.origin_topic, dead.origin_message_id) == (topic, poison_id)

    assert (await admin.ResendDlq(a.ResendDlqRequest(group=group))).status.code == (
        Code.BAD_REQUEST
    )
    unknown = await admin.ResendDlq(a.ResendDlqRequest(group=group, message_ids=["NOPE"]))
    assert unknown.status.code == Code.MESSAGE_NOT_FOUND
    resent = await admin.ResendDlq(a.ResendDlqRequest(group=group, message_ids=[poison_id]))
    assert resent.status.code == Code.OK
    assert [(m.topic, m.origin_message_id) for m in resent.resent] == [(topic, poison_id)]
    _, again, _ = await cluster.receive(group, topic)
    assert [m.body for m in again] == [b"poison"]
    # a group that never dead-lettered anything has an empty DLQ, not an error
    empty = await admin.ListDlq(a.ListDlqRequest(group=unique("clean")))
    assert empty.status.code == Code.OK and empty.total == 0


async def test_topic_route_and_cluster_status(cluster: Cluster) -> None:
    admin = _admin(cluster)
    topic = await _topic(cluster, queues=3)
    route = await admin.TopicRoute(a.TopicRouteRequest(topic=topic))
    assert route.status.code == Code.OK
    assert [(b.broker, b.address, b.queue_count) for b in route.brokers] == [
        ("broker-0", "in-process", 3), ("broker-1", "in-process", 3),
    ]  # fmt: skip
    missing = await admin.TopicRoute(a.TopicRouteRequest(topic=unique("nope")))
    assert missing.status.code == Code.TOPIC_NOT_FOUND
    status = await admin.ClusterStatus(a.ClusterStatusRequest())
    assert status.status.code == Code.OK and status.version
    assert [(b.broker, b.reachable) for b in status.brokers] == [
        ("broker-0", True), ("broker-1", True),
    ]  # fmt: skip
    assert all(b.topics >= 1 and b.rtt_ms >= 0 for b in status.brokers)
    assert list(status.groups) == []  # no groups followed in etcd


async def test_cluster_status_shows_the_replicated_groups_followed_in_etcd(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaders, epochs, in-sync sets and lags, as `cluster status --etcd --json` has them:
    what the console's /cluster shows next to the brokers."""
    from popmq.coord.directory import GroupView, Lag, Leader

    views = {
        "g1": GroupView("g1", leader=Leader("g1-0", "h:1", 7),
                        members={"g1-0": "h:1", "g1-1": "h:2"}, in_sync=["g1-0", "g1-1", "g1-2"],
                        lag={"g1-1": Lag(4096, 0.25)}),
        "g2": GroupView("g2", draining=True),
    }  # fmt: skip
    monkeypatch.setattr(cluster.server.cluster, "group_views", views)  # the module's cluster
    status = await _admin(cluster).ClusterStatus(a.ClusterStatusRequest())
    g1, g2 = status.groups
    assert (g1.name, g1.leader, g1.epoch, list(g1.in_sync)) == (
        "g1",
        "g1-0",
        7,
        ["g1-0", "g1-1", "g1-2"],
    )
    nodes = {n.name: (n.role, n.lag_bytes, n.lag_s, n.lag_known) for n in g1.nodes}
    assert nodes == {"g1-0": ("leader", 0, 0.0, True), "g1-1": ("follower", 4096, 0.25, True),
                     "g1-2": ("down", 0, 0.0, False)}  # fmt: skip
    assert (g2.leader, g2.epoch, g2.draining) == ("", 0, True)


@OWN_CLUSTER
async def test_clients_are_told_where_to_send_their_metrics(make_cluster: Any) -> None:
    """proxy.client_metrics_endpoint goes to clients in Settings.metric; off without it."""
    from test_clients_and_assignment import _settings

    settings = pb.Settings(
        client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="t")])
    )
    plain = await make_cluster(brokers=1)
    reply = await _settings(plain, settings, "producer@1")
    assert reply.metric.on is False
    on = await make_cluster(brokers=1, **{"proxy.client_metrics_endpoint": "otel.example:4317"})
    reply = await _settings(on, settings, "producer@2")
    assert reply.metric.on is True
    assert reply.metric.endpoints.scheme == pb.DOMAIN_NAME
    assert [(a.host, a.port) for a in reply.metric.endpoints.addresses] == [("otel.example", 4317)]


async def test_list_and_delete_groups_across_brokers(cluster: Cluster) -> None:
    admin = _admin(cluster)
    topic, busy, idle = await _topic(cluster), unique("busy"), unique("idle")
    update = await admin.UpdateGroup(a.UpdateGroupRequest(name=idle, max_attempts=3))
    assert update.status.code == Code.OK
    await cluster.send(topic, b"a", b"b")
    _, held, _ = await cluster.receive(busy, topic, batch=1)
    assert len(held) == 1

    listed = await admin.ListGroups(a.ListGroupsRequest())
    assert listed.status.code == Code.OK
    rows = {g.group.name: g for g in listed.groups}
    assert sorted(rows[idle].brokers) == ["broker-0", "broker-1"]  # written to every broker
    assert rows[idle].group.max_attempts == 3 and rows[busy].inflight == 1

    refused = await admin.DeleteGroup(a.DeleteGroupRequest(name=busy))
    assert refused.status.code == Code.PRECONDITION_FAILED
    assert "in flight" in refused.status.message
    still = await admin.ListGroups(a.ListGroupsRequest())
    assert busy in {g.group.name for g in still.groups}  # no broker changed
    missing = await admin.DeleteGroup(a.DeleteGroupRequest(name=unique("never")))
    assert missing.status.code == Code.CONSUMER_GROUP_NOT_FOUND
    bad = await admin.DeleteGroup(a.DeleteGroupRequest(name="bad group"))
    assert bad.status.code == Code.ILLEGAL_CONSUMER_GROUP

    forced = await admin.DeleteGroup(a.DeleteGroupRequest(name=busy, force=True))
    assert forced.status.code == Code.OK and forced.inflight == 1
    done = await admin.DeleteGroup(a.DeleteGroupRequest(name=idle, clean_offsets=True))
    assert done.status.code == Code.OK and sorted(done.brokers) == ["broker-0", "broker-1"]
    after = await admin.ListGroups(a.ListGroupsRequest())
    assert {busy, idle}.isdisjoint(g.group.name for g in after.groups)
    # the deleted group is gone for GetGroup too (no stale settings from the proxy's cache)
    got = await admin.GetGroup(a.GetGroupRequest(name=idle))
    assert got.status.code == Code.CONSUMER_GROUP_NOT_FOUND and got.group.max_attempts != 3


@OWN_CLUSTER
async def test_admin_reads_are_bounded_by_settings(make_cluster: Any) -> None:
    """An admin could make the proxy read a whole topic into memory (QueryMessages max_scan and
    limit, ListDlq limit had no upper bound): asking past proxy.admin_max_scan/_max_results is
    BAD_REQUEST, and a scan stops at proxy.admin_scan_bytes with the answer marked truncated,
    keeping the newest messages."""
    bounded = await make_cluster(
        brokers=1,
        **{
            "proxy.admin_max_scan": 50,
            "proxy.admin_max_results": 5,
            "proxy.admin_scan_bytes": 1 << 20,
        },
    )
    admin = _admin(bounded)
    topic = await _topic(bounded)
    for body in (b"a", b"b", b"c"):
        assert (await bounded.send(topic, body * 400_000, keys=["k"])).status.code == Code.OK
    found = await admin.QueryMessages(
        a.QueryMessagesRequest(topic=topic, key="k", include_body=True)
    )
    assert found.status.code == Code.OK and found.truncated  # 1.2 MB did not fit in 1 MiB
    assert [m.body[:1] for m in found.messages] == [b"c", b"b"]  # the newest ones
    too_wide = await admin.QueryMessages(a.QueryMessagesRequest(topic=topic, key="k", max_scan=51))
    assert too_wide.status.code == Code.BAD_REQUEST and "admin_max_scan" in too_wide.status.message
    too_many = await admin.QueryMessages(a.QueryMessagesRequest(topic=topic, key="k", limit=6))
    assert too_many.status.code == Code.BAD_REQUEST
    assert "admin_max_results" in too_many.status.message
    dlq = await admin.ListDlq(a.ListDlqRequest(group=unique("g"), limit=6))
    assert dlq.status.code == Code.BAD_REQUEST and "admin_max_results" in dlq.status.message


@OWN_CLUSTER
async def test_resend_dlq_refuses_before_holding_past_scan_bytes(
    make_cluster: Any, monkeypatch: Any
) -> None:
    """ResendDlq read a chunk of up to 256 dead letters before it checked
    proxy.admin_scan_bytes (256 x 4 MiB: a GiB held before the refusal). Now no more than the
    limit (and one message) is read before BAD_REQUEST, and a resend that fits still works."""
    from popmq.broker.contract.types import PROP_ORIGIN_TOPIC, Message, PullRequest, PullResult

    bounded = await make_cluster(brokers=1, **{"proxy.admin_scan_bytes": 1 << 20})
    broker = bounded.brokers[0]
    group, topic = unique("g"), await _topic(bounded)
    dlq = f"%DLQ%{group}"
    size = 200_000
    sent = await broker._append_system(  # as the broker dead-letters: into queue 0
        dlq,
        0,
        [
            Message(topic=dlq, body=bytes([65 + i]) * size, properties={PROP_ORIGIN_TOPIC: topic})
            for i in range(12)
        ],
    )  # 2.4 MB of dead letters: one pull of the old chunk took them all
    pulled: list[int] = []
    real_pull = broker.pull

    async def counting_pull(request: PullRequest) -> PullResult:
        result = await real_pull(request)
        pulled.append(sum(len(m.body) for m in result.messages))
        return result

    monkeypatch.setattr(broker, "pull", counting_pull)
    admin = _admin(bounded)
    refused = await admin.ResendDlq(a.ResendDlqRequest(group=group, all=True))
    assert refused.status.code == Code.BAD_REQUEST
    assert "admin_scan_bytes" in refused.status.message
    assert sum(pulled) <= (1 << 20) + size, pulled  # the limit and one message, no chunk
    # by id, the newest one is found past the others (each pull fits in the room left)
    pulled.clear()
    last = sent[-1].message_id
    one = await admin.ResendDlq(a.ResendDlqRequest(group=group, message_ids=[last]))
    assert one.status.code == Code.OK, one.status
    assert [m.topic for m in one.resent] == [topic]
    assert max(pulled) <= (1 << 20) + size, pulled
    _, again, _ = await bounded.receive(unique("c"), topic, batch=1)
    assert [m.body[:1] for m in again] == [b"L"]


@OWN_CLUSTER
async def test_resend_by_ids_reads_in_chunks_after_the_chosen_ones_fill_the_room(
    make_cluster: Any, monkeypatch: Any
) -> None:
    """ResendDlq by ids held the chosen messages while it read on, and each pull asked for no
    more than the room they left fits: once they filled most of proxy.admin_scan_bytes, the
    rest of the DLQ came one message a pull. Now only their places are held during the scan
    (their bytes still counted), so pulls stay large; the chosen ones alone are read again."""
    from popmq.broker.contract.types import PROP_ORIGIN_TOPIC, Message, PullRequest, PullResult

    bounded = await make_cluster(brokers=1, **{"proxy.admin_scan_bytes": 1 << 20})
    broker = bounded.brokers[0]
    group, topic = unique("g"), await _topic(bounded)
    dlq = f"%DLQ%{group}"
    big = [bytes([65 + i]) * 100_000 for i in range(9)]  # 900 KB chosen of the 1 MiB
    small = [b"s%d" % i for i in range(200)]
    sent = await broker._append_system(
        dlq,
        0,
        [Message(topic=dlq, body=b, properties={PROP_ORIGIN_TOPIC: topic}) for b in big + small],
    )
    pulls: list[int] = []
    real_pull = broker.pull

    async def counting_pull(request: PullRequest) -> PullResult:
        result = await real_pull(request)
        pulls.append(sum(len(m.body) for m in result.messages))
        return result

    monkeypatch.setattr(broker, "pull", counting_pull)
    wanted = [m.message_id for m in sent[:9]] + [sent[-1].message_id]
    resent = await _admin(bounded).ResendDlq(a.ResendDlqRequest(group=group, message_ids=wanted))
    assert resent.status.code == Code.OK, resent.status
    assert len(resent.resent) == 10
    # 209 dead letters, 10 at a pull at the largest size seen (one a pull once the big ones
    # left 124 KB), and 2 pulls to read the chosen ones again
    assert len(pulls) <= 30, pulls
    assert max(pulls) <= (1 << 20) + 100_000, pulls  # each pull still within the bound
    _, again, _ = await bounded.receive(unique("c"), topic, batch=16)
    assert sorted(m.body[:2] for m in again) == sorted([b[:2] for b in big] + [small[-1][:2]])


@OWN_CLUSTER
async def test_resend_reads_the_chosen_ones_again_past_a_pulls_byte_bound(
    make_cluster: Any,
) -> None:
    """The chosen dead letters are read again in runs of consecutive offsets; a run larger than
    one pull hands over (the broker's 8 MiB read) goes on where the pull stopped."""
    from popmq.broker.contract.types import PROP_ORIGIN_TOPIC, Message

    cluster = await make_cluster(brokers=1)
    broker = cluster.brokers[0]
    group, topic = unique("g"), await _topic(cluster)
    dlq = f"%DLQ%{group}"
    bodies = [bytes([65 + i]) * 3_500_000 for i in range(3)]  # 10.5 MB: two reads
    await broker._append_system(
        dlq, 0, [Message(topic=dlq, body=b, properties={PROP_ORIGIN_TOPIC: topic}) for b in bodies]
    )
    resent = await _admin(cluster).ResendDlq(a.ResendDlqRequest(group=group, all=True))
    assert resent.status.code == Code.OK, resent.status
    assert [m.topic for m in resent.resent] == [topic] * 3
    _, again, _ = await cluster.receive(unique("c"), topic, batch=8)
    assert sorted(m.body for m in again) == bodies
