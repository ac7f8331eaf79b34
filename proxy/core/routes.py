"""Routes and assignments: which queues of a topic exist, and which a consumer should read.

Every queue is served at this proxy's address (ProxyAddress); the edge says how to spell it.
"""

from __future__ import annotations

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import ConsumeMode
from popmq.proxy.cluster import BrokerCluster, QueueRef, TopicRoute
from popmq.proxy.core import validate
from popmq.proxy.core.assignment import allocate_averagely, allocate_for_pop
from popmq.proxy.core.context import RequestContext
from popmq.proxy.registry import ClientRegistry, member_id


class Routes:
    def __init__(
        self, cluster: BrokerCluster, registry: ClientRegistry, share_queue_num: int
    ) -> None:
        self.cluster = cluster
        self.registry = registry
        # RocketMQ's popShareQueueNum: how many other consumers' shares each POP consumer reads.
        self.share_queue_num = share_queue_num

    async def route(self, topic: str, ctx: RequestContext) -> TopicRoute:
        """QueryRoute: the topic's queues (created first if auto-creation allows it)."""
        topic = validate.topic_name(topic, allow_dlq=True)
        return await self.cluster.route(topic, create=ctx.create_topic(topic))

    async def assignment(self, topic: str, group: str, ctx: RequestContext) -> list[QueueRef]:
        """QueryAssignment: the queues this client of ``group`` should read. Asking makes the
        client a member of the group on the topic."""
        topic = validate.topic_name(topic, allow_dlq=True)
        group = validate.group_name(group)
        if not ctx.client_id:
            raise RefusedError(Code.CLIENT_ID_REQUIRED, "the x-mq-client-id header is required")
        route = await self.cluster.route(topic, create=ctx.create_topic(topic))
        config = await self.cluster.group(group)
        registry = self.registry
        info = registry.get(ctx.client_id, ctx.access_key)
        topics = validate.client_topics((info.topics if info else set()) | {topic})
        registry.touch(
            ctx.client_id, group=group, topics=topics, peer=ctx.peer, access_key=ctx.access_key
        )
        members = registry.group_members(group, topic)
        me = member_id(ctx.client_id, ctx.access_key)
        queues = sorted(route.queues, key=lambda q: (q.broker, q.queue_id))
        if config.consume_mode == ConsumeMode.PULL:
            return allocate_averagely(me, queues, members)
        return allocate_for_pop(me, queues, members, self.share_queue_num)
