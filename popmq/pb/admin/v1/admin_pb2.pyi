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
    __slots__ = ("broker", "queue_count", "queues")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    broker: str
    queue_count: int
    queues: _containers.RepeatedCompositeFieldContainer[QueueOffsets]
    def __init__(self, broker: _Optional[str] = ..., queue_count: _Optional[int] = ..., queues: _Optional[_Iterable[_Union[QueueOffsets, _Mapping]]] = ...) -> None: ...

class Topic(_message.Message):
    __slots__ = ("name", "brokers")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerTopic]
    def __init__(self, name: _Optional[str] = ..., brokers: _Optional[_Iterable[_Union[BrokerTopic, _Mapping]]] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("name", "queue_count", "brokers")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue_count: int
    brokers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., queue_count: _Optional[int] = ..., brokers: _Optional[_Iterable[str]] = ...) -> None: ...

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
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class ListClientsResponse(_message.Message):
    __slots__ = ("status", "clients", "proxy")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    PROXY_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    clients: _containers.RepeatedCompositeFieldContainer[Client]
    proxy: str
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., clients: _Optional[_Iterable[_Union[Client, _Mapping]]] = ..., proxy: _Optional[str] = ...) -> None: ...

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
