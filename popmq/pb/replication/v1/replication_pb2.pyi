from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EpochEntry(_message.Message):
    __slots__ = ("epoch", "start_offset")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    start_offset: int
    def __init__(self, epoch: _Optional[int] = ..., start_offset: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node", "epochs", "commitlog_end", "known_epoch")
    NODE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_END_FIELD_NUMBER: _ClassVar[int]
    KNOWN_EPOCH_FIELD_NUMBER: _ClassVar[int]
    node: str
    epochs: _containers.RepeatedCompositeFieldContainer[EpochEntry]
    commitlog_end: int
    known_epoch: int
    def __init__(self, node: _Optional[str] = ..., epochs: _Optional[_Iterable[_Union[EpochEntry, _Mapping]]] = ..., commitlog_end: _Optional[int] = ..., known_epoch: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("sequence", "commitlog_end")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_END_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    commitlog_end: int
    def __init__(self, sequence: _Optional[int] = ..., commitlog_end: _Optional[int] = ...) -> None: ...

class ReplicaReport(_message.Message):
    __slots__ = ("hello", "ack")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    ack: Ack
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ...) -> None: ...

class FileChange(_message.Message):
    __slots__ = ("path", "kind", "offset", "data")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        APPEND: _ClassVar[FileChange.Kind]
        REPLACE: _ClassVar[FileChange.Kind]
        DELETE: _ClassVar[FileChange.Kind]
    APPEND: FileChange.Kind
    REPLACE: FileChange.Kind
    DELETE: FileChange.Kind
    PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    path: str
    kind: FileChange.Kind
    offset: int
    data: bytes
    def __init__(self, path: _Optional[str] = ..., kind: _Optional[_Union[FileChange.Kind, str]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ReplicaBatch(_message.Message):
    __slots__ = ("sequence", "epoch", "truncate_to", "reset", "epochs", "commitlog_min", "commitlog_segment", "commitlog_offset", "commitlog_data", "files", "complete")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_TO_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_MIN_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_DATA_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    epoch: int
    truncate_to: int
    reset: bool
    epochs: _containers.RepeatedCompositeFieldContainer[EpochEntry]
    commitlog_min: int
    commitlog_segment: int
    commitlog_offset: int
    commitlog_data: bytes
    files: _containers.RepeatedCompositeFieldContainer[FileChange]
    complete: bool
    def __init__(self, sequence: _Optional[int] = ..., epoch: _Optional[int] = ..., truncate_to: _Optional[int] = ..., reset: _Optional[bool] = ..., epochs: _Optional[_Iterable[_Union[EpochEntry, _Mapping]]] = ..., commitlog_min: _Optional[int] = ..., commitlog_segment: _Optional[int] = ..., commitlog_offset: _Optional[int] = ..., commitlog_data: _Optional[bytes] = ..., files: _Optional[_Iterable[_Union[FileChange, _Mapping]]] = ..., complete: _Optional[bool] = ...) -> None: ...
