"""Conversions between the broker port's dataclasses and protos/popmq/pb/broker/v1/broker.proto.

The proto mirrors broker/contract/types.py field for field (same names), so flat dataclasses are
copied by their field list; nested values, enums and the error status are handled explicitly.
A dataclass field the proto lacks fails loudly here (and in tests/broker/test_grpc_convert.py)
instead of being dropped on the wire.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar, cast

from google.protobuf.message import Message as ProtoMessage
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import (
    FILTER_TAG,
    AckEntry,
    AckEntryResult,
    ChangeInvisibleResult,
    ConsumeMode,
    FilterExpression,
    GroupConfig,
    GroupQueueStats,
    GroupSummary,
    HalfMessageInfo,
    Message,
    NotifyRequest,
    NotifyResult,
    PoppedMessage,
    PopRequest,
    PopResult,
    PopStatus,
    PullRequest,
    PullResult,
    PullStatus,
    QueueInfo,
    SendResult,
    StoredMessage,
    TopicInfo,
    TransactionCheck,
)

from popmq.pb.broker.v1 import broker_pb2 as pb

T = TypeVar("T")
P = TypeVar("P", bound=ProtoMessage)


# -- generic field copying -----------------------------------------------------------------------


def _to_proto(obj: Any, proto_cls: type[P], **special: Any) -> P:
    """Build proto_cls from a dataclass, field by field; `special` replaces the named fields."""
    values = {
        f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name not in special
    }
    values.update(special)
    return proto_cls(**values)


def _plain(value: Any) -> Any:
    """Proto containers -> list/dict, so dataclasses never hold protobuf objects."""
    if isinstance(value, (str, bytes, int, float, bool)):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    return list(value)


def _from_proto(msg: ProtoMessage, cls: type[T], **special: Any) -> T:
    """Build the dataclass cls from a proto with the same field names."""
    values = {
        f.name: _plain(getattr(msg, f.name))
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.name not in special
    }
    values.update(special)
    return cls(**values)


# -- status: how RefusedError crosses the wire ----------------------------------------------------


def ok_status() -> pb.Status:
    return pb.Status(code=Code.OK.value)


def error_status(error: RefusedError) -> pb.Status:
    return pb.Status(code=int(error.code), message=error.message)


def raise_for_status(status: pb.Status) -> None:
    """Re-raise the broker's RefusedError on the caller's side, code unchanged."""
    if status.code == Code.OK:
        return
    try:
        code = Code(status.code)
    except ValueError:
        raise RefusedError(
            Code.INTERNAL_ERROR, f"broker answered unknown code {status.code}: {status.message}"
        ) from None
    raise RefusedError(code, status.message)


# -- enums ---------------------------------------------------------------------------------------


def pop_status_to_proto(status: PopStatus) -> pb.PopStatus:
    return cast("pb.PopStatus", pb.PopStatus.Value(f"POP_{status.name}"))


def pop_status_from_proto(value: int) -> PopStatus:
    return PopStatus[pb.PopStatus.Name(value).removeprefix("POP_")]


def pull_status_to_proto(status: PullStatus) -> int:
    return pb.PullStatus.Value(f"PULL_{status.name}")


def pull_status_from_proto(value: int) -> PullStatus:
    return PullStatus[pb.PullStatus.Name(value).removeprefix("PULL_")]


def consume_mode_to_proto(mode: ConsumeMode) -> int:
    return pb.ConsumeMode.Value(f"CONSUME_MODE_{mode.name}")


def consume_mode_from_proto(value: int) -> ConsumeMode:
    if value == pb.CONSUME_MODE_UNSPECIFIED:
        return ConsumeMode.POP  # the dataclass default
    return ConsumeMode[pb.ConsumeMode.Name(value).removeprefix("CONSUME_MODE_")]


# -- messages ------------------------------------------------------------------------------------


def filter_to_proto(expression: FilterExpression) -> pb.FilterExpression:
    return pb.FilterExpression(expression=expression.expression, type=expression.kind)


def filter_from_proto(msg: pb.FilterExpression) -> FilterExpression:
    return FilterExpression(expression=msg.expression or "*", kind=msg.type or FILTER_TAG)


def message_to_proto(message: Message) -> pb.Message:
    return _to_proto(message, pb.Message)


def message_into(target: pb.Message, message: Message) -> None:
    """``message_to_proto`` into an empty message, e.g. one added to a request: building a
    message and then adding it would copy its body twice."""
    for f in dataclasses.fields(message):
        value = getattr(message, f.name)
        if isinstance(value, list):
            getattr(target, f.name).extend(value)
        elif isinstance(value, dict):
            getattr(target, f.name).update(value)
        else:
            setattr(target, f.name, value)


def message_from_proto(msg: pb.Message) -> Message:
    return _from_proto(msg, Message)


def stored_to_proto(message: StoredMessage) -> pb.StoredMessage:
    return _to_proto(message, pb.StoredMessage)


def stored_from_proto(msg: pb.StoredMessage) -> StoredMessage:
    return _from_proto(msg, StoredMessage)


# -- produce -------------------------------------------------------------------------------------


def send_result_to_proto(result: SendResult) -> pb.SendResult:
    return _to_proto(result, pb.SendResult)


def send_result_from_proto(msg: pb.SendResult) -> SendResult:
    return _from_proto(msg, SendResult)


# -- transactions --------------------------------------------------------------------------------


def transaction_check_to_proto(check: TransactionCheck) -> pb.TransactionCheck:
    return _to_proto(check, pb.TransactionCheck, message=stored_to_proto(check.message))


def transaction_check_from_proto(msg: pb.TransactionCheck) -> TransactionCheck:
    return _from_proto(msg, TransactionCheck, message=stored_from_proto(msg.message))


def half_info_to_proto(info: HalfMessageInfo) -> pb.HalfMessageInfo:
    return _to_proto(info, pb.HalfMessageInfo)


def half_info_from_proto(msg: pb.HalfMessageInfo) -> HalfMessageInfo:
    return _from_proto(msg, HalfMessageInfo)


# -- POP -----------------------------------------------------------------------------------------


def pop_request_to_proto(request: PopRequest) -> pb.PopRequest:
    return _to_proto(request, pb.PopRequest, filter=filter_to_proto(request.filter))


def pop_request_from_proto(msg: pb.PopRequest) -> PopRequest:
    return _from_proto(msg, PopRequest, filter=filter_from_proto(msg.filter))


def popped_to_proto(popped: PoppedMessage) -> pb.PoppedMessage:
    return _to_proto(popped, pb.PoppedMessage, message=stored_to_proto(popped.message))


def popped_from_proto(msg: pb.PoppedMessage) -> PoppedMessage:
    return _from_proto(msg, PoppedMessage, message=stored_from_proto(msg.message))


def pop_result_to_proto(result: PopResult) -> pb.PopResponse:
    return pb.PopResponse(
        status=ok_status(),
        pop_status=pop_status_to_proto(result.status),
        messages=[popped_to_proto(m) for m in result.messages],
        rest_num=result.rest_num,
    )


def pop_result_from_proto(msg: pb.PopResponse) -> PopResult:
    return PopResult(
        status=pop_status_from_proto(msg.pop_status),
        messages=[popped_from_proto(m) for m in msg.messages],
        rest_num=msg.rest_num,
    )


def ack_entry_to_proto(entry: AckEntry) -> pb.AckEntry:
    return _to_proto(entry, pb.AckEntry)


def ack_entry_from_proto(msg: pb.AckEntry) -> AckEntry:
    return _from_proto(msg, AckEntry)


def ack_result_to_proto(result: AckEntryResult) -> pb.AckEntryResult:
    return _to_proto(result, pb.AckEntryResult, code=int(result.code))


def ack_result_from_proto(msg: pb.AckEntryResult) -> AckEntryResult:
    return _from_proto(msg, AckEntryResult)


def change_invisible_to_proto(result: ChangeInvisibleResult) -> pb.ChangeInvisibleTimeResponse:
    return _to_proto(result, pb.ChangeInvisibleTimeResponse, status=ok_status())


def change_invisible_from_proto(msg: pb.ChangeInvisibleTimeResponse) -> ChangeInvisibleResult:
    return _from_proto(msg, ChangeInvisibleResult)


def notify_request_to_proto(request: NotifyRequest) -> pb.NotifyRequest:
    return _to_proto(request, pb.NotifyRequest, filter=filter_to_proto(request.filter))


def notify_request_from_proto(msg: pb.NotifyRequest) -> NotifyRequest:
    return _from_proto(msg, NotifyRequest, filter=filter_from_proto(msg.filter))


def notify_result_to_proto(result: NotifyResult) -> pb.NotifyResponse:
    return _to_proto(result, pb.NotifyResponse, status=ok_status())


def notify_result_from_proto(msg: pb.NotifyResponse) -> NotifyResult:
    return _from_proto(msg, NotifyResult)


# -- pull ----------------------------------------------------------------------------------------


def pull_request_to_proto(request: PullRequest) -> pb.PullRequest:
    return _to_proto(request, pb.PullRequest, filter=filter_to_proto(request.filter))


def pull_request_from_proto(msg: pb.PullRequest) -> PullRequest:
    return _from_proto(msg, PullRequest, filter=filter_from_proto(msg.filter))


def pull_result_to_proto(result: PullResult) -> pb.PullResponse:
    return _to_proto(
        result,
        pb.PullResponse,
        status=ok_status(),
        pull_status=pull_status_to_proto(result.status),
        messages=[stored_to_proto(m) for m in result.messages],
    )


def pull_result_from_proto(msg: pb.PullResponse) -> PullResult:
    return _from_proto(
        msg,
        PullResult,
        status=pull_status_from_proto(msg.pull_status),
        messages=[stored_from_proto(m) for m in msg.messages],
    )


# -- administration ------------------------------------------------------------------------------


def topic_to_proto(topic: TopicInfo) -> pb.TopicInfo:
    return _to_proto(topic, pb.TopicInfo, queues=[_to_proto(q, pb.QueueInfo) for q in topic.queues])


def topic_from_proto(msg: pb.TopicInfo) -> TopicInfo:
    return _from_proto(
        msg,
        TopicInfo,
        queues=[_from_proto(q, QueueInfo) for q in msg.queues],
        message_type=msg.message_type or "MIXED",  # a broker from before message types
    )


def group_to_proto(group: GroupConfig) -> pb.GroupConfig:
    return _to_proto(group, pb.GroupConfig, consume_mode=consume_mode_to_proto(group.consume_mode))


def group_from_proto(msg: pb.GroupConfig) -> GroupConfig:
    return _from_proto(msg, GroupConfig, consume_mode=consume_mode_from_proto(msg.consume_mode))


def group_summary_to_proto(summary: GroupSummary) -> pb.GroupSummary:
    return pb.GroupSummary(
        config=group_to_proto(summary.config),
        inflight=summary.inflight,
        offset_queues=summary.offset_queues,
    )


def group_summary_from_proto(msg: pb.GroupSummary) -> GroupSummary:
    return GroupSummary(group_from_proto(msg.config), msg.inflight, msg.offset_queues)


def group_stats_to_proto(stats: GroupQueueStats) -> pb.GroupQueueStats:
    return _to_proto(stats, pb.GroupQueueStats)


def group_stats_from_proto(msg: pb.GroupQueueStats) -> GroupQueueStats:
    return _from_proto(msg, GroupQueueStats)
