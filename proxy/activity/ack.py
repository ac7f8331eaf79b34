"""AckMessage: each entry goes to the broker its receipt handle names; per-entry statuses."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import AckEntry, AckEntryResult
from popmq.proxy.core import validate
from popmq.proxy.core.context import RequestContext
from popmq.proxy.grpc import status as st
from popmq.proxy.services import ProxyServices

from popmq.errors import PopmqError
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

MAX_ACK_ENTRIES = 1024


async def ack_message(
    services: ProxyServices, request: s.AckMessageRequest, ctx: RequestContext
) -> s.AckMessageResponse:
    group = validate.group_name(request.group.name)
    topic = validate.topic_name(request.topic.name, allow_dlq=True)
    if not request.entries:
        raise RefusedError(Code.BAD_REQUEST, "AckMessage needs at least one entry")
    if len(request.entries) > MAX_ACK_ENTRIES:
        raise RefusedError(Code.BAD_REQUEST, f"at most {MAX_ACK_ENTRIES} entries per ack")

    results: list[AckEntryResult | None] = [None] * len(request.entries)
    by_broker: dict[str, list[int]] = defaultdict(list)
    for entry in request.entries:  # a PushConsumer acks with the handle it got: use the latest
        entry.receipt_handle = await services.renewer.take(entry.receipt_handle)
    for index, entry in enumerate(request.entries):
        try:
            port = services.cluster.port_for_handle(entry.receipt_handle)
        except RefusedError as exc:
            results[index] = AckEntryResult(
                entry.receipt_handle, entry.message_id, int(exc.code), exc.message
            )
            continue
        by_broker[port.name].append(index)

    async def ack_on(broker: str, indexes: list[int]) -> None:
        entries = [
            AckEntry(request.entries[i].receipt_handle, request.entries[i].message_id)
            for i in indexes
        ]
        try:
            answers = await services.cluster.port(broker).ack(group, topic, entries)
        except PopmqError as exc:  # the whole call failed: every entry shares its code
            answers = [
                AckEntryResult(e.receipt_handle, e.message_id, int(exc.code), exc.message)
                for e in entries
            ]
        for i, answer in zip(indexes, answers, strict=True):
            results[i] = answer

    if len(by_broker) == 1:  # handles of one receive come from one broker: no task needed
        await ack_on(*next(iter(by_broker.items())))
    else:  # one task per broker, owned here: a failure cancels the others, nothing dangles
        async with asyncio.TaskGroup() as tasks:
            for broker, indexes in by_broker.items():
                tasks.create_task(ack_on(broker, indexes))
    done = [r for r in results if r is not None]
    statuses: dict[tuple[int, str], pb.Status] = {}  # nearly every entry shares one status
    entries = []
    for r in done:
        status = statuses.get((r.code, r.message))
        if status is None:
            status = statuses[r.code, r.message] = st.status(r.code, r.message)
        entries.append(
            s.AckMessageResultEntry(
                message_id=r.message_id, receipt_handle=r.receipt_handle, status=status
            )
        )
    code = st.combined_code([Code(c) for c in {c for c, _ in statuses}])
    message = entries[0].status.message if code != Code.MULTIPLE_RESULTS else "see entries"
    return s.AckMessageResponse(status=st.status(code, message), entries=entries)
