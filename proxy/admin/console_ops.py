"""AdminService operations the web console needs: who the caller is (so it can show a
non-admin only what its grants reach) and a test message (the /messages page's send form).

Kept small: the console is a client of the admin API like `popmq admin`, nothing more.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from popmq.proxy.core.admin import Admin
from popmq.proxy.core.caller import CALLER
from popmq.proxy.grpc import status as st

from popmq.pb.admin.v1 import admin_pb2 as a


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
            broker, message, sent = await self.admin.send_test_message(
                request.topic, request.body, request.tag, list(request.keys),
                dict(request.properties),
            )  # fmt: skip
            view = a.StoredMessageView(
                broker=broker, topic=message.topic, queue_id=sent.queue_id,
                queue_offset=sent.queue_offset, message_id=sent.message_id,
                tag=request.tag, keys=list(request.keys), body_size=len(request.body),
                born_timestamp_ms=message.born_timestamp_ms,
            )  # fmt: skip
            return a.SendTestMessageResponse(status=st.ok(), message=view)

        return await self._answer(a.SendTestMessageResponse, work)
