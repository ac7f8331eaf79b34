"""A held long poll keeps its request's names for its whole wait: protobuf makes a new string
at each read, so 10,000 idle polls of one group kept 10,000 copies of its group, topic, filter
and broker (docs/benchmarks.md, "Idle polls, wave 11"). They are shared now."""

from __future__ import annotations

from popmq.proxy.grpc import shared_names
from popmq.proxy.grpc.receive import receive_request

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s


def _decoded() -> s.ReceiveMessageRequest:
    """A request as grpc hands it over: decoded from the wire, its own strings."""
    queue = pb.MessageQueue(topic=pb.Resource(name="t-names"), broker=pb.Broker(name="broker-0"))
    request = s.ReceiveMessageRequest(
        group=pb.Resource(name="g-names"), message_queue=queue, batch_size=8,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="tag-a || tag-b"),
    )  # fmt: skip
    return s.ReceiveMessageRequest.FromString(request.SerializeToString())


def test_receives_of_one_group_share_their_names() -> None:
    one, two = receive_request(_decoded()), receive_request(_decoded())
    assert (one.group, one.topic, one.filter_expression, one.broker) == (
        "g-names", "t-names", "tag-a || tag-b", "broker-0",
    )  # fmt: skip
    assert one.group is two.group and one.topic is two.topic
    assert one.filter_expression is two.filter_expression and one.broker is two.broker


def test_the_shared_names_are_bounded() -> None:
    """Names come from strangers: a flood of distinct names keeps at most SHARED_NAMES_MAX of
    them (sys.intern would keep each for good from Python 3.12 on), and a long one none."""
    for n in range(shared_names.SHARED_NAMES_MAX * 3):
        shared_names.shared_name(f"flood-{n}")
    assert len(shared_names._SHARED) <= shared_names.SHARED_NAMES_MAX
    long_name = "x" * (shared_names.SHARED_NAME_CHARS + 1)
    shared_names.shared_name(long_name)
    assert long_name not in shared_names._SHARED
