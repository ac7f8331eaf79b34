"""BrokerPort: everything a proxy (or a tool) may ask of one broker, and its narrower parts.

ConsumePort (pop, notify, change invisible time, hand back) is what the long-poll strategies hold;
MessagingPort adds send, ack, DLQ and offsets; AdminPort is topics and groups. BrokerPort is
both, plus close(). Take the narrowest one a component needs.

Two implementations share it: ``broker.local.LocalBrokerPort`` calls a ``Broker`` in the
same process, ``broker.wire.remote.RemoteBrokerPort`` calls a broker's gRPC server. Code above
this line does not know which it holds.

Every method raises ``broker.contract.errors.RefusedError`` with a RocketMQ ``Code`` when it refuses
a request, and a remote port a TransportError (BrokerUnavailableError, BrokerTimeoutError) when
the broker gives no answer (see popmq.errors). Long-polling calls (pop, pull, notify with
``poll_time_ms > 0``) return at their timeout with an empty result, and stop holding anything
on the broker when the caller's task is cancelled.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from popmq.broker.contract.types import (
    AckEntry,
    AckEntryResult,
    ChangeInvisibleResult,
    GroupConfig,
    GroupDeleted,
    GroupQueueStats,
    GroupSummary,
    HalfMessageInfo,
    Message,
    NotifyRequest,
    NotifyResult,
    PopRequest,
    PopResult,
    PullRequest,
    PullResult,
    SendResult,
    TopicInfo,
    TransactionCheck,
)


class _Named(Protocol):
    @property
    def name(self) -> str:
        """The broker's name (as written in receipt handles and routes)."""
        ...


def in_process(port: object) -> bool:
    """True for a port whose broker runs in this process (``broker.local.LocalBrokerPort``
    sets ``in_process = True``). Its pop and notify are plain Python on the caller's task: a
    pop takes its messages and returns them without giving the loop a turn in between (it
    suspends only while it holds, before it has taken anything), so a caller cancelled at
    any point either gets the whole answer or the broker took nothing. The long polls call
    such a port directly, without a task per call to keep an answer that arrives as its
    caller is cancelled (what a remote port needs: its broker may have popped already)."""
    return getattr(port, "in_process", False) is True


@runtime_checkable
class ConsumePort(_Named, Protocol):
    """What the long-poll strategies use: pop, notify, and giving a message back."""

    async def pop(self, request: PopRequest) -> PopResult: ...

    async def change_invisible_time(
        self, group: str, topic: str, receipt_handle: str, invisible_time_ms: int
    ) -> ChangeInvisibleResult: ...

    async def hand_back(self, group: str, topic: str, receipt_handles: list[str]) -> int:
        """Give back popped messages no consumer received: visible at once, no delivery
        attempt counted (FIFO: in place, in order). Handles no longer pending (acked,
        changed, expired) are skipped. Returns how many were handed back."""
        ...

    async def notify(self, request: NotifyRequest) -> NotifyResult: ...


@runtime_checkable
class MessagingPort(ConsumePort, Protocol):
    """Producing and consuming: what the messaging activities ask of a broker."""

    # -- produce -----------------------------------------------------------------------------
    async def send(self, messages: list[Message], queue_id: int = -1) -> list[SendResult]:
        """Store messages; queue_id -1 lets the broker choose (message group hash, else
        round robin). Returns one result per message, after the flush policy allows."""
        ...

    # -- POP consumption (pop, notify, change_invisible_time: ConsumePort) --------------------
    async def ack(self, group: str, topic: str, entries: list[AckEntry]) -> list[AckEntryResult]:
        """Ack each entry on its own; a bad handle fails only its entry."""
        ...

    async def recall(self, topic: str, recall_handle: str) -> str:
        """Cancel a delay message not delivered yet; its message id (RecallMessage)."""
        ...

    async def end_transaction(
        self, topic: str, message_id: str, transaction_id: str, commit: bool, source: str = ""
    ) -> None:
        """COMMIT (deliver the half message) or ROLLBACK (discard it); a repeat of the decision
        taken is OK, anything else for an ended or unknown one INVALID_TRANSACTION_ID.
        ``source``: CLIENT, SERVER_CHECK or ADMIN (for logs and metrics)."""
        ...

    async def claim_transaction_checks(
        self, topics: list[str], limit: int = 64
    ) -> list[TransactionCheck]:
        """Half messages of ``topics`` due for a check-back; each one returned is counted as
        checked (so another proxy does not ask again within the check interval)."""
        ...

    async def list_transactions(self) -> list[HalfMessageInfo]:
        """Undecided transactional messages, parked ones included."""
        ...

    async def forward_to_dlq(self, group: str, topic: str, receipt_handle: str) -> None:
        """Move a popped message to %DLQ%group now and ack it (client-requested)."""
        ...

    # -- offset-based consumption ------------------------------------------------------------
    async def pull(self, request: PullRequest) -> PullResult: ...

    async def get_consumer_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset; -1 when the group never committed on that queue."""
        ...

    async def update_consumer_offset(
        self, group: str, topic: str, queue_id: int, offset: int
    ) -> None: ...

    async def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset stored at or after timestamp_ms (max offset if none)."""
        ...


@runtime_checkable
class AdminPort(_Named, Protocol):
    """Topics, groups and their figures: what admin and routing ask of a broker."""

    # -- administration ----------------------------------------------------------------------
    async def create_topic(self, topic: str, queue_count: int, message_type: str = "") -> TopicInfo:
        """Create or grow a topic; ``message_type`` (a MessageType name) sets its type, empty
        keeps it (MIXED for a new topic)."""
        ...

    async def get_topic(self, topic: str, auto_create: bool = False) -> TopicInfo:
        """TopicInfo with per-queue min/max offsets; TOPIC_NOT_FOUND unless auto-created."""
        ...

    async def list_topics(self) -> list[TopicInfo]: ...

    async def delete_topic(self, topic: str) -> None: ...

    async def get_group(self, group: str) -> GroupConfig:
        """The group's config (created with defaults on first use)."""
        ...

    async def update_group(self, config: GroupConfig) -> GroupConfig: ...

    async def list_groups(self) -> list[GroupSummary]:
        """Every registered group, with its in-flight count and committed-offset queues."""
        ...

    async def delete_group(
        self, group: str, clean_offsets: bool = False, force: bool = False
    ) -> GroupDeleted:
        """Forget a group's settings (and with clean_offsets its offsets). PRECONDITION_FAILED
        while messages are in flight unless force; CONSUMER_GROUP_NOT_FOUND if unknown."""
        ...

    async def group_stats(self, group: str, topic: str) -> list[GroupQueueStats]: ...


@runtime_checkable
class BrokerPort(MessagingPort, AdminPort, Protocol):
    """Everything a proxy (or a tool) may ask of one broker, and releasing the port (the
    ports are also async context managers: ``async with`` closes them)."""

    async def aclose(self) -> None:
        """Release the port (the remote port closes its channel, the local one its watches;
        the broker itself keeps running)."""
        ...
