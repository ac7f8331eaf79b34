"""popmq's private DescriptorPool (written by gen_protos.py: do not edit).

Our apache.rocketmq.v2 types live here, not in protobuf's default pool, so that popmq imports
in a process that also uses the official rocketmq-python-client (which registers the same
symbols in the default pool). Messages of this pool take this pool's well-known types: build
Timestamp and Duration values with the classes below, not google.protobuf's.
"""

from typing import TYPE_CHECKING

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf import duration_pb2
from google.protobuf import timestamp_pb2

POOL = descriptor_pool.DescriptorPool()

for _module in (duration_pb2, timestamp_pb2,):
    _file = descriptor_pb2.FileDescriptorProto()
    _module.DESCRIPTOR.CopyToProto(_file)
    POOL.Add(_file)


def message_class(full_name: str) -> type:
    """The message class of a type in this pool (e.g. "google.protobuf.Timestamp")."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(full_name))


if TYPE_CHECKING:  # for type checkers: the same fields and methods as google.protobuf's
    from google.protobuf.duration_pb2 import Duration as Duration
    from google.protobuf.timestamp_pb2 import Timestamp as Timestamp
else:
    Duration = message_class("google.protobuf.Duration")
    Timestamp = message_class("google.protobuf.Timestamp")
