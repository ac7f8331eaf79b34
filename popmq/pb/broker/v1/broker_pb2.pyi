from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PopStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POP_STATUS_UNSPECIFIED: _ClassVar[PopStatus]
    POP_FOUND: _ClassVar[PopStatus]
    POP_NO_MESSAGE: _ClassVar[PopStatus]
    POP_POLLING_FULL: _ClassVar[PopStatus]

class PullStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PULL_STATUS_UNSPECIFIED: _ClassVar[PullStatus]
    PULL_FOUND: _ClassVar[PullStatus]
    PULL_NO_NEW_MESSAGE: _ClassVar[PullStatus]
    PULL_OFFSET_ILLEGAL: _ClassVar[PullStatus]
    PULL_OFFSET_PURGED: _ClassVar[PullStatus]
    PULL_POLLING_FULL: _ClassVar[PullStatus]

class ConsumeMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONSUME_MODE_UNSPECIFIED: _ClassVar[ConsumeMode]
    CONSUME_MODE_POP: _ClassVar[ConsumeMode]
    CONSUME_MODE_PULL: _ClassVar[ConsumeMode]
POP_STATUS_UNSPECIFIED: PopStatus
POP_FOUND: PopStatus
POP_NO_MESSAGE: PopStatus
POP_POLLING_FULL: PopStatus
PULL_STATUS_UNSPECIFIED: PullStatus
PULL_FOUND: PullStatus
PULL_NO_NEW_MESSAGE: PullStatus
PULL_OFFSET_ILLEGAL: PullStatus
PULL_OFFSET_PURGED: PullStatus
PULL_POLLING_FULL: PullStatus
CONSUME_MODE_UNSPECIFIED: ConsumeMode
CONSUME_MODE_POP: ConsumeMode
CONSUME_MODE_PULL: ConsumeMode

class Status(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class FilterExpression(_message.Message):
    __slots__ = ("expression", "type")
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    expression: str
    type: str
    def __init__(self, expression: _Optional[str] = ..., type: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("topic", "body", "tag", "keys", "properties", "message_id", "message_group", "delivery_timestamp_ms", "born_timestamp_ms", "born_host", "reconsume_times")
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
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_GROUP_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    body: bytes
    tag: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    properties: _containers.ScalarMap[str, str]
    message_id: str
    message_group: str
    delivery_timestamp_ms: int
    born_timestamp_ms: int
    born_host: str
    reconsume_times: int
    def __init__(self, topic: _Optional[str] = ..., body: _Optional[bytes] = ..., tag: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., properties: _Optional[_Mapping[str, str]] = ..., message_id: _Optional[str] = ..., message_group: _Optional[str] = ..., delivery_timestamp_ms: _Optional[int] = ..., born_timestamp_ms: _Optional[int] = ..., born_host: _Optional[str] = ..., reconsume_times: _Optional[int] = ...) -> None: ...

class StoredMessage(_message.Message):
    __slots__ = ("topic", "queue_id", "queue_offset", "body", "tag", "keys", "properties", "message_id", "message_group", "delivery_timestamp_ms", "born_timestamp_ms", "born_host", "store_timestamp_ms", "store_host", "reconsume_times")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_GROUP_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    tag: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    properties: _containers.ScalarMap[str, str]
    message_id: str
    message_group: str
    delivery_timestamp_ms: int
    born_timestamp_ms: int
    born_host: str
    store_timestamp_ms: int
    store_host: str
    reconsume_times: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., body: _Optional[bytes] = ..., tag: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., properties: _Optional[_Mapping[str, str]] = ..., message_id: _Optional[str] = ..., message_group: _Optional[str] = ..., delivery_timestamp_ms: _Optional[int] = ..., born_timestamp_ms: _Optional[int] = ..., born_host: _Optional[str] = ..., store_timestamp_ms: _Optional[int] = ..., store_host: _Optional[str] = ..., reconsume_times: _Optional[int] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("status", "name")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    status: Status
    name: str
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., name: _Optional[str] = ...) -> None: ...

class SendRequest(_message.Message):
    __slots__ = ("messages", "queue_id")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    queue_id: int
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., queue_id: _Optional[int] = ...) -> None: ...

class SendResult(_message.Message):
    __slots__ = ("message_id", "topic", "queue_id", "queue_offset", "broker_name", "recall_handle", "transaction_id")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    RECALL_HANDLE_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    topic: str
    queue_id: int
    queue_offset: int
    broker_name: str
    recall_handle: str
    transaction_id: str
    def __init__(self, message_id: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., broker_name: _Optional[str] = ..., recall_handle: _Optional[str] = ..., transaction_id: _Optional[str] = ...) -> None: ...

class SendResponse(_message.Message):
    __slots__ = ("status", "results")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    results: _containers.RepeatedCompositeFieldContainer[SendResult]
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., results: _Optional[_Iterable[_Union[SendResult, _Mapping]]] = ...) -> None: ...

class PopRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "max_messages", "invisible_time_ms", "poll_time_ms", "filter", "fifo")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    POLL_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    FIFO_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    max_messages: int
    invisible_time_ms: int
    poll_time_ms: int
    filter: FilterExpression
    fifo: bool
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., max_messages: _Optional[int] = ..., invisible_time_ms: _Optional[int] = ..., poll_time_ms: _Optional[int] = ..., filter: _Optional[_Union[FilterExpression, _Mapping]] = ..., fifo: _Optional[bool] = ...) -> None: ...

class PoppedMessage(_message.Message):
    __slots__ = ("message", "receipt_handle", "invisible_until_ms")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    message: StoredMessage
    receipt_handle: str
    invisible_until_ms: int
    def __init__(self, message: _Optional[_Union[StoredMessage, _Mapping]] = ..., receipt_handle: _Optional[str] = ..., invisible_until_ms: _Optional[int] = ...) -> None: ...

class PopResponse(_message.Message):
    __slots__ = ("status", "pop_status", "messages", "rest_num")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    POP_STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    REST_NUM_FIELD_NUMBER: _ClassVar[int]
    status: Status
    pop_status: PopStatus
    messages: _containers.RepeatedCompositeFieldContainer[PoppedMessage]
    rest_num: int
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., pop_status: _Optional[_Union[PopStatus, str]] = ..., messages: _Optional[_Iterable[_Union[PoppedMessage, _Mapping]]] = ..., rest_num: _Optional[int] = ...) -> None: ...

class AckEntry(_message.Message):
    __slots__ = ("receipt_handle", "message_id")
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    receipt_handle: str
    message_id: str
    def __init__(self, receipt_handle: _Optional[str] = ..., message_id: _Optional[str] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("group", "topic", "entries")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    entries: _containers.RepeatedCompositeFieldContainer[AckEntry]
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[AckEntry, _Mapping]]] = ...) -> None: ...

class AckEntryResult(_message.Message):
    __slots__ = ("receipt_handle", "message_id", "code", "message")
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    receipt_handle: str
    message_id: str
    code: int
    message: str
    def __init__(self, receipt_handle: _Optional[str] = ..., message_id: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("status", "results")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    results: _containers.RepeatedCompositeFieldContainer[AckEntryResult]
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., results: _Optional[_Iterable[_Union[AckEntryResult, _Mapping]]] = ...) -> None: ...

class ChangeInvisibleTimeRequest(_message.Message):
    __slots__ = ("group", "topic", "receipt_handle", "invisible_time_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    receipt_handle: str
    invisible_time_ms: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handle: _Optional[str] = ..., invisible_time_ms: _Optional[int] = ...) -> None: ...

class ChangeInvisibleTimeResponse(_message.Message):
    __slots__ = ("status", "receipt_handle", "invisible_until_ms")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    receipt_handle: str
    invisible_until_ms: int
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., receipt_handle: _Optional[str] = ..., invisible_until_ms: _Optional[int] = ...) -> None: ...

class HandBackRequest(_message.Message):
    __slots__ = ("group", "topic", "receipt_handles")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    receipt_handles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handles: _Optional[_Iterable[str]] = ...) -> None: ...

class HandBackResponse(_message.Message):
    __slots__ = ("status", "handed_back")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HANDED_BACK_FIELD_NUMBER: _ClassVar[int]
    status: Status
    handed_back: int
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., handed_back: _Optional[int] = ...) -> None: ...

class NotifyRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "poll_time_ms", "filter", "fifo")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    POLL_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    FIFO_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    poll_time_ms: int
    filter: FilterExpression
    fifo: bool
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., poll_time_ms: _Optional[int] = ..., filter: _Optional[_Union[FilterExpression, _Mapping]] = ..., fifo: _Optional[bool] = ...) -> None: ...

class NotifyResponse(_message.Message):
    __slots__ = ("status", "has_message", "polling_full")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HAS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    POLLING_FULL_FIELD_NUMBER: _ClassVar[int]
    status: Status
    has_message: bool
    polling_full: bool
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., has_message: _Optional[bool] = ..., polling_full: _Optional[bool] = ...) -> None: ...

class ForwardToDlqRequest(_message.Message):
    __slots__ = ("group", "topic", "receipt_handle")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    receipt_handle: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handle: _Optional[str] = ...) -> None: ...

class ForwardToDlqResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ...) -> None: ...

class RecallRequest(_message.Message):
    __slots__ = ("topic", "recall_handle")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECALL_HANDLE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    recall_handle: str
    def __init__(self, topic: _Optional[str] = ..., recall_handle: _Optional[str] = ...) -> None: ...

class RecallResponse(_message.Message):
    __slots__ = ("status", "message_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message_id: str
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., message_id: _Optional[str] = ...) -> None: ...

class EndTransactionRequest(_message.Message):
    __slots__ = ("topic", "message_id", "transaction_id", "commit", "source")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    message_id: str
    transaction_id: str
    commit: bool
    source: str
    def __init__(self, topic: _Optional[str] = ..., message_id: _Optional[str] = ..., transaction_id: _Optional[str] = ..., commit: _Optional[bool] = ..., source: _Optional[str] = ...) -> None: ...

class EndTransactionResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ...) -> None: ...

class ClaimTransactionChecksRequest(_message.Message):
    __slots__ = ("topics", "limit")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    limit: int
    def __init__(self, topics: _Optional[_Iterable[str]] = ..., limit: _Optional[int] = ...) -> None: ...

class TransactionCheck(_message.Message):
    __slots__ = ("message", "transaction_id", "checks")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    message: StoredMessage
    transaction_id: str
    checks: int
    def __init__(self, message: _Optional[_Union[StoredMessage, _Mapping]] = ..., transaction_id: _Optional[str] = ..., checks: _Optional[int] = ...) -> None: ...

class ClaimTransactionChecksResponse(_message.Message):
    __slots__ = ("status", "checks")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    checks: _containers.RepeatedCompositeFieldContainer[TransactionCheck]
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., checks: _Optional[_Iterable[_Union[TransactionCheck, _Mapping]]] = ...) -> None: ...

class ListTransactionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HalfMessageInfo(_message.Message):
    __slots__ = ("topic", "message_id", "transaction_id", "stored_ms", "checks", "parked")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    STORED_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    topic: str
    message_id: str
    transaction_id: str
    stored_ms: int
    checks: int
    parked: bool
    def __init__(self, topic: _Optional[str] = ..., message_id: _Optional[str] = ..., transaction_id: _Optional[str] = ..., stored_ms: _Optional[int] = ..., checks: _Optional[int] = ..., parked: _Optional[bool] = ...) -> None: ...

class ListTransactionsResponse(_message.Message):
    __slots__ = ("status", "halves")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HALVES_FIELD_NUMBER: _ClassVar[int]
    status: Status
    halves: _containers.RepeatedCompositeFieldContainer[HalfMessageInfo]
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., halves: _Optional[_Iterable[_Union[HalfMessageInfo, _Mapping]]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "offset", "max_messages", "poll_time_ms", "filter")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    POLL_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    max_messages: int
    poll_time_ms: int
    filter: FilterExpression
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., poll_time_ms: _Optional[int] = ..., filter: _Optional[_Union[FilterExpression, _Mapping]] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("status", "pull_status", "messages", "next_offset", "min_offset", "max_offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PULL_STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: Status
    pull_status: PullStatus
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., pull_status: _Optional[_Union[PullStatus, str]] = ..., messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ..., next_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class QueueRef(_message.Message):
    __slots__ = ("group", "topic", "queue_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class GetConsumerOffsetResponse(_message.Message):
    __slots__ = ("status", "offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: Status
    offset: int
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., offset: _Optional[int] = ...) -> None: ...

class UpdateConsumerOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    offset: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class UpdateConsumerOffsetResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ...) -> None: ...

class OffsetForTimestampRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "timestamp_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class OffsetForTimestampResponse(_message.Message):
    __slots__ = ("status", "offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: Status
    offset: int
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., offset: _Optional[int] = ...) -> None: ...

class QueueInfo(_message.Message):
    __slots__ = ("queue_id", "min_offset", "max_offset")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    min_offset: int
    max_offset: int
    def __init__(self, queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class TopicInfo(_message.Message):
    __slots__ = ("name", "queue_count", "queues", "message_type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue_count: int
    queues: _containers.RepeatedCompositeFieldContainer[QueueInfo]
    message_type: str
    def __init__(self, name: _Optional[str] = ..., queue_count: _Optional[int] = ..., queues: _Optional[_Iterable[_Union[QueueInfo, _Mapping]]] = ..., message_type: _Optional[str] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("topic", "queue_count", "message_type")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_count: int
    message_type: str
    def __init__(self, topic: _Optional[str] = ..., queue_count: _Optional[int] = ..., message_type: _Optional[str] = ...) -> None: ...

class GetTopicRequest(_message.Message):
    __slots__ = ("topic", "auto_create")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    AUTO_CREATE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    auto_create: bool
    def __init__(self, topic: _Optional[str] = ..., auto_create: _Optional[bool] = ...) -> None: ...

class TopicResponse(_message.Message):
    __slots__ = ("status", "topic")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    status: Status
    topic: TopicInfo
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., topic: _Optional[_Union[TopicInfo, _Mapping]] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("status", "topics")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    topics: _containers.RepeatedCompositeFieldContainer[TopicInfo]
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., topics: _Optional[_Iterable[_Union[TopicInfo, _Mapping]]] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ...) -> None: ...

class GroupConfig(_message.Message):
    __slots__ = ("name", "consume_mode", "max_attempts", "retry_levels", "fifo")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONSUME_MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RETRY_LEVELS_FIELD_NUMBER: _ClassVar[int]
    FIFO_FIELD_NUMBER: _ClassVar[int]
    name: str
    consume_mode: ConsumeMode
    max_attempts: int
    retry_levels: _containers.RepeatedScalarFieldContainer[str]
    fifo: bool
    def __init__(self, name: _Optional[str] = ..., consume_mode: _Optional[_Union[ConsumeMode, str]] = ..., max_attempts: _Optional[int] = ..., retry_levels: _Optional[_Iterable[str]] = ..., fifo: _Optional[bool] = ...) -> None: ...

class GetGroupRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class GroupResponse(_message.Message):
    __slots__ = ("status", "group")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    status: Status
    group: GroupConfig
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., group: _Optional[_Union[GroupConfig, _Mapping]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupSummary(_message.Message):
    __slots__ = ("config", "inflight", "offset_queues")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_QUEUES_FIELD_NUMBER: _ClassVar[int]
    config: GroupConfig
    inflight: int
    offset_queues: int
    def __init__(self, config: _Optional[_Union[GroupConfig, _Mapping]] = ..., inflight: _Optional[int] = ..., offset_queues: _Optional[int] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("status", "groups")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    groups: _containers.RepeatedCompositeFieldContainer[GroupSummary]
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., groups: _Optional[_Iterable[_Union[GroupSummary, _Mapping]]] = ...) -> None: ...

class DeleteGroupRequest(_message.Message):
    __slots__ = ("group", "clean_offsets", "force")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CLEAN_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    group: str
    clean_offsets: bool
    force: bool
    def __init__(self, group: _Optional[str] = ..., clean_offsets: _Optional[bool] = ..., force: _Optional[bool] = ...) -> None: ...

class DeleteGroupResponse(_message.Message):
    __slots__ = ("status", "inflight", "offsets_removed")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    status: Status
    inflight: int
    offsets_removed: int
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., inflight: _Optional[int] = ..., offsets_removed: _Optional[int] = ...) -> None: ...

class GroupStatsRequest(_message.Message):
    __slots__ = ("group", "topic")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class GroupQueueStats(_message.Message):
    __slots__ = ("topic", "queue_id", "consumer_offset", "max_offset", "inflight")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    consumer_offset: int
    max_offset: int
    inflight: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., consumer_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., inflight: _Optional[int] = ...) -> None: ...

class GroupStatsResponse(_message.Message):
    __slots__ = ("status", "stats")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    stats: _containers.RepeatedCompositeFieldContainer[GroupQueueStats]
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., stats: _Optional[_Iterable[_Union[GroupQueueStats, _Mapping]]] = ...) -> None: ...

class WatchArm(_message.Message):
    __slots__ = ("id", "seq", "group", "topic", "filter", "fifo")
    ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    FIFO_FIELD_NUMBER: _ClassVar[int]
    id: int
    seq: int
    group: str
    topic: str
    filter: FilterExpression
    fifo: bool
    def __init__(self, id: _Optional[int] = ..., seq: _Optional[int] = ..., group: _Optional[str] = ..., topic: _Optional[str] = ..., filter: _Optional[_Union[FilterExpression, _Mapping]] = ..., fifo: _Optional[bool] = ...) -> None: ...

class WatchCancel(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("arm", "cancel")
    ARM_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    arm: WatchArm
    cancel: WatchCancel
    def __init__(self, arm: _Optional[_Union[WatchArm, _Mapping]] = ..., cancel: _Optional[_Union[WatchCancel, _Mapping]] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("id", "seq", "status")
    ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    id: int
    seq: int
    status: Status
    def __init__(self, id: _Optional[int] = ..., seq: _Optional[int] = ..., status: _Optional[_Union[Status, _Mapping]] = ...) -> None: ...

class LinkCancel(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LinkRequest(_message.Message):
    __slots__ = ("id", "send", "pop", "ack", "change_invisible_time", "notify", "forward_to_dlq", "pull", "cancel", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    POP_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CHANGE_INVISIBLE_TIME_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_FIELD_NUMBER: _ClassVar[int]
    FORWARD_TO_DLQ_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    id: int
    send: SendRequest
    pop: PopRequest
    ack: AckRequest
    change_invisible_time: ChangeInvisibleTimeRequest
    notify: NotifyRequest
    forward_to_dlq: ForwardToDlqRequest
    pull: PullRequest
    cancel: LinkCancel
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[int] = ..., send: _Optional[_Union[SendRequest, _Mapping]] = ..., pop: _Optional[_Union[PopRequest, _Mapping]] = ..., ack: _Optional[_Union[AckRequest, _Mapping]] = ..., change_invisible_time: _Optional[_Union[ChangeInvisibleTimeRequest, _Mapping]] = ..., notify: _Optional[_Union[NotifyRequest, _Mapping]] = ..., forward_to_dlq: _Optional[_Union[ForwardToDlqRequest, _Mapping]] = ..., pull: _Optional[_Union[PullRequest, _Mapping]] = ..., cancel: _Optional[_Union[LinkCancel, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class LinkResponse(_message.Message):
    __slots__ = ("id", "send", "pop", "ack", "change_invisible_time", "notify", "forward_to_dlq", "pull")
    ID_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    POP_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CHANGE_INVISIBLE_TIME_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_FIELD_NUMBER: _ClassVar[int]
    FORWARD_TO_DLQ_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    id: int
    send: SendResponse
    pop: PopResponse
    ack: AckResponse
    change_invisible_time: ChangeInvisibleTimeResponse
    notify: NotifyResponse
    forward_to_dlq: ForwardToDlqResponse
    pull: PullResponse
    def __init__(self, id: _Optional[int] = ..., send: _Optional[_Union[SendResponse, _Mapping]] = ..., pop: _Optional[_Union[PopResponse, _Mapping]] = ..., ack: _Optional[_Union[AckResponse, _Mapping]] = ..., change_invisible_time: _Optional[_Union[ChangeInvisibleTimeResponse, _Mapping]] = ..., notify: _Optional[_Union[NotifyResponse, _Mapping]] = ..., forward_to_dlq: _Optional[_Union[ForwardToDlqResponse, _Mapping]] = ..., pull: _Optional[_Union[PullResponse, _Mapping]] = ...) -> None: ...

class LinkRequests(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[LinkRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[LinkRequest, _Mapping]]] = ...) -> None: ...

class LinkResponses(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[LinkResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[LinkResponse, _Mapping]]] = ...) -> None: ...
