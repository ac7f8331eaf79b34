"""AdminService operations the web console needs: who the caller is (so it can show a
non-admin only what its grants reach) and a test message (the /messages page's send form).

Kept small: the console is a client of the admin API like `popmq admin`, nothing more.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message
from popmq.proxy.core import validate
from popmq.proxy.core.admin import Admin
from popmq.proxy.core.caller import CALLER
from popmq.proxy.grpc import status as st

from popmq.pb.admin.v1 import admin_pb2 as a

MAX_TEST_BODY_BYTES = 4 * 1024 * 1024  # RocketMQ's default max message size


class ConsoleOpsMixin:
    """Mixed into AdminServicer (which provides ``admin`` and ``_answer``)."""

    admin: Admin
    _answer: Callable[[type, Callable[[], Awaitable[Any]]], Awaitable[Any]]

    async def WhoAmI(self, request: a.WhoAmIRequest, context: object) -> a.WhoAmIResponse:
        caller = CALLER.get()
        if caller is None:  # no ACL: nobody is known, everything is allowed
            return a.WhoAmIResponse(status=st.ok(), acl=False, admin=True)
        response = a.WhoAmIResponse(status=st.ok(), acl=True, access_key=caller.access_key)
        user = caller.user
        if user is None:
            return response
        response.admin = user.admin
        for grant in user.allow:
            if grant.publish is not None:
                response.grants.append(
                    a.Grant(publish=grant.publish, namespace=grant.namespace or "")
                )
            elif grant.subscribe is not None:
                topics = grant.subscribe.topics
                response.grants.append(
                    a.Grant(
                        subscribe_group=grant.subscribe.group,
                        subscribe_topics=list(topics or ()),
                        any_topic=topics is None,
                        namespace=grant.namespace or "",
                    )
                )
        return response

    async def SendTestMessage(
        self, request: a.SendTestMessageRequest, context: object
    ) -> a.SendTestMessageResponse:
        async def work() -> a.SendTestMessageResponse:
            topic = validate.topic_name(request.topic)
            if len(request.body) > MAX_TEST_BODY_BYTES:
                raise RefusedError(Code.MESSAGE_BODY_TOO_LARGE, "the body is over 4 MiB")
            infos = await self.admin.cluster.topic_infos(topic)
            broker = random.choice(list(infos))  # as a producer spreads its sends
            message = Message(
                topic=topic, body=request.body, tag=request.tag, keys=list(request.keys),
                properties=dict(request.properties), born_timestamp_ms=int(time.time() * 1000),
                born_host="popmq-console",
            )  # fmt: skip
            sent = await self.admin.cluster.port(broker).send([message])
            view = a.StoredMessageView(
                broker=broker, topic=topic, queue_id=sent[0].queue_id,
                queue_offset=sent[0].queue_offset, message_id=sent[0].message_id,
                tag=request.tag, keys=list(request.keys), body_size=len(request.body),
                born_timestamp_ms=message.born_timestamp_ms,
            )  # fmt: skip
            return a.SendTestMessageResponse(status=st.ok(), message=view)

        return await self._answer(a.SendTestMessageResponse, work)
