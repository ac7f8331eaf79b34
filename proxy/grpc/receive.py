"""ReceiveMessage's request on the wire, read into the core's ReceiveRequest (the servicer
streams the answer)."""

from __future__ import annotations

from popmq.proxy.core.receive import ReceiveRequest
from popmq.proxy.grpc.shared_names import shared_name

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s


def filter_kind(value: int) -> str:
    """A FilterType's name for the core (TAG, SQL; anything else is read as a tag filter)."""
    return "SQL" if value == pb.SQL else "TAG"


def receive_request(request: s.ReceiveMessageRequest) -> ReceiveRequest:
    """The request's names are shared between requests (``shared_name``)."""
    expression = request.filter_expression
    intern = shared_name
    queue = request.message_queue
    return ReceiveRequest(
        group=intern(request.group.name),
        topic=intern(queue.topic.name),
        batch_size=request.batch_size,
        auto_renew=request.auto_renew,
        invisible_time=(
            request.invisible_duration if request.HasField("invisible_duration") else None
        ),
        poll_time=(
            request.long_polling_timeout if request.HasField("long_polling_timeout") else None
        ),
        filter_kind=filter_kind(expression.type),
        filter_expression=intern(expression.expression),
        broker=intern(queue.broker.name),
    )
