from popmq.pb.rocketmq.v2 import definition_pb2 as _definition_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueueOffsets(_message.Message):
    __slots__ = ("queue_id", "min_offset", "max_offset")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    min_offset: int
    max_offset: int
    def __init__(self, queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class BrokerTopic(_message.Message):
    __slots__ = ("broker", "queue_count", "queues", "message_type")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    broker: str
    queue_count: int
    queues: _containers.RepeatedCompositeFieldContainer[QueueOffsets]
    message_type: str
    def __init__(self, broker: _Optional[str] = ..., queue_count: _Optional[int] = ..., queues: _Optional[_Iterable[_Union[QueueOffsets, _Mapping]]] = ..., message_type: _Optional[str] = ...) -> None: ...

class Topic(_message.Message):
    __slots__ = ("name", "brokers")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerTopic]
    def __init__(self, name: _Optional[str] = ..., brokers: _Optional[_Iterable[_Union[BrokerTopic, _Mapping]]] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("name", "queue_count", "brokers", "message_type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue_count: int
    brokers: _containers.RepeatedScalarFieldContainer[str]
    message_type: str
    def __init__(self, name: _Optional[str] = ..., queue_count: _Optional[int] = ..., brokers: _Optional[_Iterable[str]] = ..., message_type: _Optional[str] = ...) -> None: ...

class TopicResponse(_message.Message):
    __slots__ = ("status", "topic")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    topic: Topic
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., topic: _Optional[_Union[Topic, _Mapping]] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ("include_system",)
    INCLUDE_SYSTEM_FIELD_NUMBER: _ClassVar[int]
    include_system: bool
    def __init__(self, include_system: _Optional[bool] = ...) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("status", "topics")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    topics: _containers.RepeatedCompositeFieldContainer[Topic]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., topics: _Optional[_Iterable[_Union[Topic, _Mapping]]] = ...) -> None: ...

class DescribeTopicRequest(_message.Message):
    __slots__ = ("name", "group")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    name: str
    group: str
    def __init__(self, name: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class GroupQueue(_message.Message):
    __slots__ = ("broker", "queue_id", "consumer_offset", "max_offset", "backlog", "inflight", "topic")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    broker: str
    queue_id: int
    consumer_offset: int
    max_offset: int
    backlog: int
    inflight: int
    topic: str
    def __init__(self, broker: _Optional[str] = ..., queue_id: _Optional[int] = ..., consumer_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., backlog: _Optional[int] = ..., inflight: _Optional[int] = ..., topic: _Optional[str] = ...) -> None: ...

class DescribeTopicResponse(_message.Message):
    __slots__ = ("status", "topic", "group_queues")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_QUEUES_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    topic: Topic
    group_queues: _containers.RepeatedCompositeFieldContainer[GroupQueue]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., topic: _Optional[_Union[Topic, _Mapping]] = ..., group_queues: _Optional[_Iterable[_Union[GroupQueue, _Mapping]]] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ...) -> None: ...

class Group(_message.Message):
    __slots__ = ("name", "consume_mode", "max_attempts", "retry_levels", "fifo")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONSUME_MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RETRY_LEVELS_FIELD_NUMBER: _ClassVar[int]
    FIFO_FIELD_NUMBER: _ClassVar[int]
    name: str
    consume_mode: str
    max_attempts: int
    retry_levels: _containers.RepeatedScalarFieldContainer[str]
    fifo: bool
    def __init__(self, name: _Optional[str] = ..., consume_mode: _Optional[str] = ..., max_attempts: _Optional[int] = ..., retry_levels: _Optional[_Iterable[str]] = ..., fifo: _Optional[bool] = ...) -> None: ...

class GetGroupRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UpdateGroupRequest(_message.Message):
    __slots__ = ("name", "consume_mode", "max_attempts", "retry_levels", "reset_retry_levels", "fifo")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONSUME_MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RETRY_LEVELS_FIELD_NUMBER: _ClassVar[int]
    RESET_RETRY_LEVELS_FIELD_NUMBER: _ClassVar[int]
    FIFO_FIELD_NUMBER: _ClassVar[int]
    name: str
    consume_mode: str
    max_attempts: int
    retry_levels: _containers.RepeatedScalarFieldContainer[str]
    reset_retry_levels: bool
    fifo: bool
    def __init__(self, name: _Optional[str] = ..., consume_mode: _Optional[str] = ..., max_attempts: _Optional[int] = ..., retry_levels: _Optional[_Iterable[str]] = ..., reset_retry_levels: _Optional[bool] = ..., fifo: _Optional[bool] = ...) -> None: ...

class GroupResponse(_message.Message):
    __slots__ = ("status", "group")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    group: Group
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., group: _Optional[_Union[Group, _Mapping]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupSummary(_message.Message):
    __slots__ = ("group", "brokers", "inflight", "offset_queues")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_QUEUES_FIELD_NUMBER: _ClassVar[int]
    group: Group
    brokers: _containers.RepeatedScalarFieldContainer[str]
    inflight: int
    offset_queues: int
    def __init__(self, group: _Optional[_Union[Group, _Mapping]] = ..., brokers: _Optional[_Iterable[str]] = ..., inflight: _Optional[int] = ..., offset_queues: _Optional[int] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("status", "groups")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    groups: _containers.RepeatedCompositeFieldContainer[GroupSummary]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., groups: _Optional[_Iterable[_Union[GroupSummary, _Mapping]]] = ...) -> None: ...

class DeleteGroupRequest(_message.Message):
    __slots__ = ("name", "clean_offsets", "force")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CLEAN_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    clean_offsets: bool
    force: bool
    def __init__(self, name: _Optional[str] = ..., clean_offsets: _Optional[bool] = ..., force: _Optional[bool] = ...) -> None: ...

class DeleteGroupResponse(_message.Message):
    __slots__ = ("status", "brokers", "inflight", "offsets_removed")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    brokers: _containers.RepeatedScalarFieldContainer[str]
    inflight: int
    offsets_removed: int
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., brokers: _Optional[_Iterable[str]] = ..., inflight: _Optional[int] = ..., offsets_removed: _Optional[int] = ...) -> None: ...

class ListTransactionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HalfTransaction(_message.Message):
    __slots__ = ("broker", "topic", "message_id", "transaction_id", "stored_ms", "checks", "parked")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    STORED_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    broker: str
    topic: str
    message_id: str
    transaction_id: str
    stored_ms: int
    checks: int
    parked: bool
    def __init__(self, broker: _Optional[str] = ..., topic: _Optional[str] = ..., message_id: _Optional[str] = ..., transaction_id: _Optional[str] = ..., stored_ms: _Optional[int] = ..., checks: _Optional[int] = ..., parked: _Optional[bool] = ...) -> None: ...

class ListTransactionsResponse(_message.Message):
    __slots__ = ("status", "transactions")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    transactions: _containers.RepeatedCompositeFieldContainer[HalfTransaction]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., transactions: _Optional[_Iterable[_Union[HalfTransaction, _Mapping]]] = ...) -> None: ...

class ResolveTransactionRequest(_message.Message):
    __slots__ = ("message_id", "commit")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    commit: bool
    def __init__(self, message_id: _Optional[str] = ..., commit: _Optional[bool] = ...) -> None: ...

class ResolveTransactionResponse(_message.Message):
    __slots__ = ("status", "broker", "topic")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BROKER_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    broker: str
    topic: str
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., broker: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class Client(_message.Message):
    __slots__ = ("client_id", "client_type", "group", "topics", "language", "version", "peer", "first_seen", "last_seen", "telemetry_open")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEEN_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_OPEN_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    client_type: str
    group: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    language: str
    version: str
    peer: str
    first_seen: float
    last_seen: float
    telemetry_open: bool
    def __init__(self, client_id: _Optional[str] = ..., client_type: _Optional[str] = ..., group: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., language: _Optional[str] = ..., version: _Optional[str] = ..., peer: _Optional[str] = ..., first_seen: _Optional[float] = ..., last_seen: _Optional[float] = ..., telemetry_open: _Optional[bool] = ...) -> None: ...

class ListClientsRequest(_message.Message):
    __slots__ = ("group", "page_size", "page_token")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    group: str
    page_size: int
    page_token: str
    def __init__(self, group: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListClientsResponse(_message.Message):
    __slots__ = ("status", "clients", "proxy", "next_page_token")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    PROXY_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    clients: _containers.RepeatedCompositeFieldContainer[Client]
    proxy: str
    next_page_token: str
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., clients: _Optional[_Iterable[_Union[Client, _Mapping]]] = ..., proxy: _Optional[str] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("status", "prometheus_text")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PROMETHEUS_TEXT_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    prometheus_text: str
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., prometheus_text: _Optional[str] = ...) -> None: ...

class ConsumerProgressRequest(_message.Message):
    __slots__ = ("group", "topic")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class QueueProgress(_message.Message):
    __slots__ = ("broker", "topic", "queue_id", "consumer_offset", "max_offset", "lag", "inflight", "lag_latency_ms")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    LAG_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    broker: str
    topic: str
    queue_id: int
    consumer_offset: int
    max_offset: int
    lag: int
    inflight: int
    lag_latency_ms: int
    def __init__(self, broker: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., consumer_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., lag: _Optional[int] = ..., inflight: _Optional[int] = ..., lag_latency_ms: _Optional[int] = ...) -> None: ...

class ConsumerProgressResponse(_message.Message):
    __slots__ = ("status", "queues")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    queues: _containers.RepeatedCompositeFieldContainer[QueueProgress]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., queues: _Optional[_Iterable[_Union[QueueProgress, _Mapping]]] = ...) -> None: ...

class ResetOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "timestamp_ms", "earliest", "latest")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    timestamp_ms: int
    earliest: bool
    latest: bool
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., timestamp_ms: _Optional[int] = ..., earliest: _Optional[bool] = ..., latest: _Optional[bool] = ...) -> None: ...

class OffsetReset(_message.Message):
    __slots__ = ("broker", "queue_id", "old_offset", "new_offset")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OLD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEW_OFFSET_FIELD_NUMBER: _ClassVar[int]
    broker: str
    queue_id: int
    old_offset: int
    new_offset: int
    def __init__(self, broker: _Optional[str] = ..., queue_id: _Optional[int] = ..., old_offset: _Optional[int] = ..., new_offset: _Optional[int] = ...) -> None: ...

class ResetOffsetResponse(_message.Message):
    __slots__ = ("status", "queues")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    queues: _containers.RepeatedCompositeFieldContainer[OffsetReset]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., queues: _Optional[_Iterable[_Union[OffsetReset, _Mapping]]] = ...) -> None: ...

class StoredMessageView(_message.Message):
    __slots__ = ("broker", "topic", "queue_id", "queue_offset", "message_id", "tag", "keys", "born_timestamp_ms", "store_timestamp_ms", "reconsume_times", "body_size", "body", "origin_topic", "origin_message_id", "properties")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BROKER_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    BODY_SIZE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_TOPIC_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    broker: str
    topic: str
    queue_id: int
    queue_offset: int
    message_id: str
    tag: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    born_timestamp_ms: int
    store_timestamp_ms: int
    reconsume_times: int
    body_size: int
    body: bytes
    origin_topic: str
    origin_message_id: str
    properties: _containers.ScalarMap[str, str]
    def __init__(self, broker: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., message_id: _Optional[str] = ..., tag: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., born_timestamp_ms: _Optional[int] = ..., store_timestamp_ms: _Optional[int] = ..., reconsume_times: _Optional[int] = ..., body_size: _Optional[int] = ..., body: _Optional[bytes] = ..., origin_topic: _Optional[str] = ..., origin_message_id: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ...) -> None: ...

class QueryMessagesRequest(_message.Message):
    __slots__ = ("topic", "message_id", "key", "max_scan", "limit", "include_body", "start_ms", "end_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_SCAN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_BODY_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    message_id: str
    key: str
    max_scan: int
    limit: int
    include_body: bool
    start_ms: int
    end_ms: int
    def __init__(self, topic: _Optional[str] = ..., message_id: _Optional[str] = ..., key: _Optional[str] = ..., max_scan: _Optional[int] = ..., limit: _Optional[int] = ..., include_body: _Optional[bool] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ...) -> None: ...

class QueryMessagesResponse(_message.Message):
    __slots__ = ("status", "messages", "truncated")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessageView]
    truncated: bool
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[StoredMessageView, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class ListDlqRequest(_message.Message):
    __slots__ = ("group", "limit")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    group: str
    limit: int
    def __init__(self, group: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListDlqResponse(_message.Message):
    __slots__ = ("status", "messages", "total", "truncated")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessageView]
    total: int
    truncated: bool
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[StoredMessageView, _Mapping]]] = ..., total: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...

class ResendDlqRequest(_message.Message):
    __slots__ = ("group", "message_ids", "all")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    group: str
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    def __init__(self, group: _Optional[str] = ..., message_ids: _Optional[_Iterable[str]] = ..., all: _Optional[bool] = ...) -> None: ...

class ResendDlqResponse(_message.Message):
    __slots__ = ("status", "resent")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESENT_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    resent: _containers.RepeatedCompositeFieldContainer[StoredMessageView]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., resent: _Optional[_Iterable[_Union[StoredMessageView, _Mapping]]] = ...) -> None: ...

class TopicRouteRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class RouteBroker(_message.Message):
    __slots__ = ("broker", "address", "queue_count")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    broker: str
    address: str
    queue_count: int
    def __init__(self, broker: _Optional[str] = ..., address: _Optional[str] = ..., queue_count: _Optional[int] = ...) -> None: ...

class TopicRouteResponse(_message.Message):
    __slots__ = ("status", "topic", "proxy", "brokers")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PROXY_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    topic: str
    proxy: str
    brokers: _containers.RepeatedCompositeFieldContainer[RouteBroker]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., topic: _Optional[str] = ..., proxy: _Optional[str] = ..., brokers: _Optional[_Iterable[_Union[RouteBroker, _Mapping]]] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BrokerStatus(_message.Message):
    __slots__ = ("broker", "address", "reachable", "rtt_ms", "topics", "error")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    broker: str
    address: str
    reachable: bool
    rtt_ms: float
    topics: int
    error: str
    def __init__(self, broker: _Optional[str] = ..., address: _Optional[str] = ..., reachable: _Optional[bool] = ..., rtt_ms: _Optional[float] = ..., topics: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class GroupNode(_message.Message):
    __slots__ = ("name", "role", "lag_bytes", "lag_s", "lag_known")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LAG_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAG_S_FIELD_NUMBER: _ClassVar[int]
    LAG_KNOWN_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    lag_bytes: int
    lag_s: float
    lag_known: bool
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., lag_bytes: _Optional[int] = ..., lag_s: _Optional[float] = ..., lag_known: _Optional[bool] = ...) -> None: ...

class BrokerGroup(_message.Message):
    __slots__ = ("name", "leader", "epoch", "in_sync", "draining", "nodes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    name: str
    leader: str
    epoch: int
    in_sync: _containers.RepeatedScalarFieldContainer[str]
    draining: bool
    nodes: _containers.RepeatedCompositeFieldContainer[GroupNode]
    def __init__(self, name: _Optional[str] = ..., leader: _Optional[str] = ..., epoch: _Optional[int] = ..., in_sync: _Optional[_Iterable[str]] = ..., draining: _Optional[bool] = ..., nodes: _Optional[_Iterable[_Union[GroupNode, _Mapping]]] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("status", "proxy", "version", "brokers", "clients", "groups")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PROXY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    proxy: str
    version: str
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerStatus]
    clients: int
    groups: _containers.RepeatedCompositeFieldContainer[BrokerGroup]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., proxy: _Optional[str] = ..., version: _Optional[str] = ..., brokers: _Optional[_Iterable[_Union[BrokerStatus, _Mapping]]] = ..., clients: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[BrokerGroup, _Mapping]]] = ...) -> None: ...

class WhoAmIRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Grant(_message.Message):
    __slots__ = ("publish", "subscribe_group", "subscribe_topics", "any_topic", "namespace")
    PUBLISH_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBE_GROUP_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBE_TOPICS_FIELD_NUMBER: _ClassVar[int]
    ANY_TOPIC_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    publish: str
    subscribe_group: str
    subscribe_topics: _containers.RepeatedScalarFieldContainer[str]
    any_topic: bool
    namespace: str
    def __init__(self, publish: _Optional[str] = ..., subscribe_group: _Optional[str] = ..., subscribe_topics: _Optional[_Iterable[str]] = ..., any_topic: _Optional[bool] = ..., namespace: _Optional[str] = ...) -> None: ...

class WhoAmIResponse(_message.Message):
    __slots__ = ("status", "acl", "access_key", "admin", "grants")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ACL_FIELD_NUMBER: _ClassVar[int]
    ACCESS_KEY_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    acl: bool
    access_key: str
    admin: bool
    grants: _containers.RepeatedCompositeFieldContainer[Grant]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., acl: _Optional[bool] = ..., access_key: _Optional[str] = ..., admin: _Optional[bool] = ..., grants: _Optional[_Iterable[_Union[Grant, _Mapping]]] = ...) -> None: ...

class SendTestMessageRequest(_message.Message):
    __slots__ = ("topic", "body", "tag", "keys", "properties")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    body: bytes
    tag: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    properties: _containers.ScalarMap[str, str]
    def __init__(self, topic: _Optional[str] = ..., body: _Optional[bytes] = ..., tag: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., properties: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SendTestMessageResponse(_message.Message):
    __slots__ = ("status", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    message: StoredMessageView
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., message: _Optional[_Union[StoredMessageView, _Mapping]] = ...) -> None: ...
