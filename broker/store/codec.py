"""The binary record of one stored message (the payload of a commitlog frame).

Layout, little endian: a fixed header (``_HEADER``) holding the numbers and the byte length of
every variable field, then the fields in this order: topic, tag, message id, message group,
born host, store host, keys, properties, body. Keys and properties are sequences of
``[u32 length][utf-8 bytes]`` (properties as key, value, key, value ...). Topic and tag come
first so recovery can index a record without decoding the rest.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message, StoredMessage

RECORD_VERSION = 1

# version, flags, topic len, queue id, queue offset, store ts, born ts, delivery ts,
# reconsume times, tag len, message id len, group len, born host len, store host len,
# keys len, properties len, body len
_HEADER = struct.Struct("<BBHIQqqqIHHHHHIII")
HEADER_SIZE = _HEADER.size
_U32 = struct.Struct("<I")
_pack_header = _HEADER.pack
_unpack_header = _HEADER.unpack_from
_pack_u32 = _U32.pack
_unpack_u32 = _U32.unpack_from


class RecordHeader(NamedTuple):
    """What indexing needs from a record."""

    topic: str
    queue_id: int
    queue_offset: int
    tag: str
    store_timestamp_ms: int


def tag_hash(tag: str) -> int:
    """The 32-bit tag code kept in queue indexes, so tag filters skip without reading."""
    return zlib.crc32(tag.encode())


def _encode_strings(items: list[str]) -> bytes:
    parts: list[bytes] = []
    for item in items:
        raw = item.encode()
        parts.append(_pack_u32(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def _encode_properties(properties: dict[str, str]) -> bytes:
    parts: list[bytes] = []
    for key, value in properties.items():
        raw_key = key.encode()
        raw_value = value.encode()
        parts.append(_pack_u32(len(raw_key)))
        parts.append(raw_key)
        parts.append(_pack_u32(len(raw_value)))
        parts.append(raw_value)
    return b"".join(parts)


def _decode_strings(data: bytes | memoryview, start: int, end: int) -> list[str]:
    # The field is copied out once and split as bytes: slicing a memoryview per string and
    # decoding it cost about twice as much (a message's keys and properties, every read).
    raw = bytes(data[start:end])
    size_of = _unpack_u32
    items: list[str] = []
    pos = 0
    stop = len(raw)
    try:
        while pos < stop:
            (size,) = size_of(raw, pos)
            pos += 4
            items.append(raw[pos : pos + size].decode())
            pos += size
    except struct.error:
        raise ValueError("string list overruns its field") from None
    if pos != stop:
        raise ValueError("string list overruns its field")
    return items


def encode_record(
    message: Message,
    topic: bytes,
    queue_id: int,
    queue_offset: int,
    store_timestamp_ms: int,
    store_host: bytes,
    message_id: str | None = None,
) -> bytes:
    """Encode a message as stored. ``topic`` and ``store_host`` come pre-encoded (hot path);
    ``message_id`` replaces the message's own (the store makes one when it is empty)."""
    head = encode_record_head(message, topic, queue_id, queue_offset, store_timestamp_ms,
                              store_host, message_id)  # fmt: skip
    return head + message.body


def encode_record_head(
    message: Message,
    topic: bytes,
    queue_id: int,
    queue_offset: int,
    store_timestamp_ms: int,
    store_host: bytes,
    message_id: str | None = None,
) -> bytes:
    """The record without its body, which comes last: the record is this followed by
    ``message.body``, so a writer can write a large body from where it is (no copy)."""
    tag = message.tag.encode()
    message_id_bytes = (message.message_id if message_id is None else message_id).encode()
    group = message.message_group.encode()
    born_host = message.born_host.encode()
    keys = _encode_strings(message.keys) if message.keys else b""
    properties = _encode_properties(message.properties) if message.properties else b""
    body = message.body
    try:
        header = _pack_header(
            RECORD_VERSION,
            0,
            len(topic),
            queue_id,
            queue_offset,
            store_timestamp_ms,
            message.born_timestamp_ms,
            message.delivery_timestamp_ms,
            message.reconsume_times,
            len(tag),
            len(message_id_bytes),
            len(group),
            len(born_host),
            len(store_host),
            len(keys),
            len(properties),
            len(body),
        )
    except struct.error as exc:
        raise RefusedError(
            Code.BAD_REQUEST,
            f"message field out of range (topic, tag, id, group and host are limited to "
            f"65535 bytes, numbers must be non-negative where unsigned): {exc}",
        ) from None
    return b"".join((header, topic, tag, message_id_bytes, group, born_host, store_host, keys,
                     properties))  # fmt: skip


def decode_record(payload: bytes | memoryview) -> StoredMessage:
    """Decode a whole record. Raises ValueError when it is not a valid record."""
    try:
        (version, _flags, topic_len, queue_id, queue_offset, store_ts, born_ts, delivery_ts,
         reconsume, tag_len, id_len, group_len, born_host_len, store_host_len, keys_len,
         props_len, body_len) = _unpack_header(payload, 0)  # fmt: skip
    except struct.error:
        raise ValueError("record shorter than its header") from None
    if version != RECORD_VERSION:
        raise ValueError(f"unknown record version {version}")
    pos = HEADER_SIZE
    names_end = pos + topic_len + tag_len + id_len + group_len + born_host_len + store_host_len
    end = names_end + keys_len + props_len + body_len
    if end != len(payload):
        raise ValueError("record length does not match its header")
    # The six names lie side by side: mostly ASCII, then one decode and six slices (a decode
    # each, from a memoryview slice each, was a fifth of a record's decoding).
    names = bytes(payload[pos:names_end])
    a = topic_len
    b = a + tag_len
    c = b + id_len
    d = c + group_len
    e = d + born_host_len
    if names.isascii():
        text = names.decode("ascii")
        topic, tag, message_id, group = text[:a], text[a:b], text[b:c], text[c:d]
        born_host, store_host = text[d:e], text[e:]
    else:
        topic, tag, message_id = (
            str(names[:a], "utf-8"),
            str(names[a:b], "utf-8"),
            str(names[b:c], "utf-8"),
        )
        group, born_host = str(names[c:d], "utf-8"), str(names[d:e], "utf-8")
        store_host = str(names[e:], "utf-8")
    pos = names_end
    keys = _decode_strings(payload, pos, pos + keys_len) if keys_len else []
    pos += keys_len
    properties: dict[str, str] = {}
    if props_len:
        flat = _decode_strings(payload, pos, pos + props_len)
        if len(flat) % 2:
            raise ValueError("odd number of property strings")
        properties = dict(zip(flat[::2], flat[1::2], strict=True))
    pos += props_len
    body = bytes(payload[pos : pos + body_len])
    return StoredMessage(  # positional: keywords cost a third more for 15 fields
        topic, queue_id, queue_offset, body, tag, keys, properties, message_id, group,
        delivery_ts, born_ts, born_host, store_ts, store_host, reconsume,
    )  # fmt: skip


def decode_header(payload: bytes | memoryview) -> RecordHeader:
    """Decode just what indexing needs. Raises ValueError on a malformed record."""
    try:
        fields = _unpack_header(payload, 0)
    except struct.error:
        raise ValueError("record shorter than its header") from None
    if fields[0] != RECORD_VERSION:
        raise ValueError(f"unknown record version {fields[0]}")
    topic_len = fields[2]
    tag_len = fields[9]
    pos = HEADER_SIZE
    if pos + topic_len + tag_len > len(payload):
        raise ValueError("record shorter than its topic and tag")
    topic = str(payload[pos : pos + topic_len], "utf-8")
    tag = str(payload[pos + topic_len : pos + topic_len + tag_len], "utf-8")
    return RecordHeader(topic, fields[3], fields[4], tag, fields[5])
