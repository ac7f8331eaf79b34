"""SendMessage on the wire: protobuf messages to the core's, outcomes to entries and statuses."""

from __future__ import annotations

from popmq.broker.contract.errors import Code
from popmq.broker.wire.bodies import take_bodies
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.processor import ProxyCore
from popmq.proxy.core.send import body_size
from popmq.proxy.grpc import status as st
from popmq.proxy.grpc.convert import outgoing_from_pb

from popmq.budget import MemoryBudget
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s


async def send_message(
    core: ProxyCore,
    request: s.SendMessageRequest,
    ctx: RequestContext,
    budget: MemoryBudget | None = None,
) -> s.SendMessageResponse:
    bodies = take_bodies(request)  # a large batch's bodies, left in grpc's bytes of it
    if bodies is None:
        outgoing = [outgoing_from_pb(m) for m in request.messages]
    else:
        outgoing = [
            outgoing_from_pb(m, body) for m, body in zip(request.messages, bodies, strict=True)
        ]
    if budget is None:
        outcomes = await core.sender.send(outgoing, ctx)
    else:
        # The bodies weigh (keys and properties are bounded); never request.ByteSize(): upb
        # encodes the whole request to measure it (a 128 MiB batch: seconds, and twice its
        # size in transient memory).
        async with budget.hold(sum(body_size(m.body) for m in outgoing)):
            outcomes = await core.sender.send(outgoing, ctx)
    stored = s.SendResultEntry(status=st.ok())  # each stored message's entry starts as this
    failed: dict[int, s.SendResultEntry] = {}  # a failed batch: one status for all its messages
    codes = set()
    response = s.SendMessageResponse()
    # Built in place (a list of entries would be copied in again), each entry a copy of one
    # made with its status: 0.8 us an entry against 1.4 for add(status=...).
    add = response.entries.add
    for outcome in outcomes:
        result = outcome.result
        if outcome.error is None:
            assert result is not None
            codes.add(Code.OK)
            entry = add()
            entry.CopyFrom(stored)
            entry.message_id = result.message_id
            entry.offset = result.queue_offset
            if result.recall_handle:  # empty fields are not set: each costs a copy
                entry.recall_handle = result.recall_handle
            if result.transaction_id:
                entry.transaction_id = result.transaction_id
            continue
        template = failed.get(id(outcome.error))
        if template is None:
            status = st.status_of(outcome.error)
            template = failed[id(outcome.error)] = s.SendResultEntry(status=status)
            codes.add(Code(status.code))
        entry = add()
        entry.CopyFrom(template)
        entry.message_id = outcome.message_id
    code = st.combined_code(list(codes))
    summary = response.entries[0].status.message if code != Code.MULTIPLE_RESULTS else "see entries"
    response.status.CopyFrom(st.status(code, summary))
    return response


async def end_transaction(
    core: ProxyCore, request: s.EndTransactionRequest, ctx: RequestContext
) -> s.EndTransactionResponse:
    try:
        resolution = pb.TransactionResolution.Name(request.resolution)
    except ValueError:
        resolution = f"UNKNOWN({request.resolution})"
    try:
        source = pb.TransactionSource.Name(request.source).removeprefix("SOURCE_")
    except ValueError:
        source = "CLIENT"
    await core.transactions.end(
        request.topic.name, request.message_id, request.transaction_id, resolution, source
    )
    return s.EndTransactionResponse(status=st.ok())


async def recall_message(
    core: ProxyCore, request: s.RecallMessageRequest, ctx: RequestContext
) -> s.RecallMessageResponse:
    message_id = await core.sender.recall(request.topic.name, request.recall_handle)
    return s.RecallMessageResponse(status=st.ok(), message_id=message_id)
