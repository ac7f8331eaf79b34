"""A batch send decoded without copying its bodies.

grpc hands a handler the request's bytes and keeps them until the call ends; decoding them
with protobuf copies every body once more (upb's parse), and that copy is held for the whole
call: a 32 x 4 MiB SendMessage was held twice over while it was served. Here the request's
encoding is split instead: each message's ``body`` field is cut out as a view of grpc's bytes
(no copy), and only the rest (topics, properties, ids: small) is decoded by protobuf. The
handler reads each body from its view when it sends it on.

Only the two levels the bodies sit at are walked (the request's repeated message field, and
each message's fields); anything unexpected there (a group, a truncated field) leaves the
request to protobuf's own decoding, which refuses a malformed one as it always did.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from popmq.allocator import TRIM_AFTER_BYTES, trim

M = TypeVar("M")

# Requests smaller than this are decoded whole: their bodies' copy costs little, and walking
# their fields in Python would cost more than it saves.
SPLIT_FROM_BYTES = 1 << 20

_LEN = 2  # the length-delimited wire type


class _Unexpected(Exception):
    """The encoding is not what the walk expects: protobuf decodes it (or refuses it)."""


def _varint(data: memoryview, pos: int, end: int, most_bytes: int = 10) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift >= 7 * most_bytes:
            raise _Unexpected
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _varint32(data: memoryview, pos: int, end: int) -> tuple[int, int]:
    """A key or a length: protobuf refuses one longer than 5 bytes or past 32 bits, and the
    split rewrites or drops some of them, so such a one is left to protobuf to refuse."""
    value, pos = _varint(data, pos, end, 5)
    if value >> 32:
        raise _Unexpected
    return value, pos


def _head(number: int, length: int) -> bytes:
    """The key and length of a length-delimited field."""
    out = bytearray()
    for value in (number << 3 | _LEN, length):
        while value > 0x7F:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out)


def _fields(data: memoryview, pos: int, end: int) -> list[tuple[int, int, int, int, int]]:
    """(number, wire type, start, value start, end) of each field in data[pos:end], in order:
    the field's bytes are data[start:end]; a length-delimited value's, data[value start:end]."""
    out = []
    while pos < end:
        start = pos
        key, pos = _varint32(data, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Unexpected
        value = pos
        if wire == 0:
            _, pos = _varint(data, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == _LEN:
            length, value = _varint32(data, pos, end)
            pos = value + length
        elif wire == 5:
            pos += 4
        else:  # groups (deprecated) or an invalid wire type
            raise _Unexpected
        if pos > end:
            raise _Unexpected
        out.append((number, wire, start, value, pos))
    return out


def split(
    data: bytes, messages_field: int, body_field: int
) -> tuple[bytes, list[memoryview | None]]:
    """``data`` (a request with a repeated message field) without its messages' bodies, and
    each message's body as a view of ``data`` (None: the message has none), in order."""
    view = memoryview(data)
    parts: list[bytes | memoryview] = []
    bodies: list[memoryview | None] = []
    for number, wire, start, value, end in _fields(view, 0, len(view)):
        if number != messages_field:
            parts.append(view[start:end])
            continue
        if wire != _LEN:
            raise _Unexpected
        kept: list[memoryview] = []
        body: memoryview | None = None
        for inner, inner_wire, at, inner_value, inner_end in _fields(view, value, end):
            if inner == body_field and inner_wire == _LEN:
                body = view[inner_value:inner_end]  # the last one wins, as in protobuf
            else:
                kept.append(view[at:inner_end])
        rest = b"".join(kept)
        parts += [_head(messages_field, len(rest)), rest]
        bodies.append(body)
    return b"".join(parts), bodies


# The bodies split off the request this task is serving: (the decoded request, its bodies).
# grpc runs a call's deserializer and its handler in the call's one task, so the handler finds
# them here (a protobuf message takes no attributes); they go with the task.
_SPLIT: ContextVar[tuple[Any, list[memoryview | None]] | None] = ContextVar(
    "split_bodies", default=None
)


def splitting_decoder(
    parse: Callable[[bytes], M], messages_field: int, body_field: int
) -> Callable[[bytes], M]:
    """A request deserializer: ``parse`` for small requests; for large ones, ``parse`` of the
    request without its bodies, the bodies kept as views for ``take_bodies``."""

    def decode(data: bytes) -> M:
        if len(data) < SPLIT_FROM_BYTES:
            return parse(data)
        try:
            stripped, bodies = split(data, messages_field, body_field)
        except (_Unexpected, IndexError):
            return parse(data)  # protobuf's verdict on it, as for any request
        request = parse(stripped)
        _SPLIT.set((request, bodies))
        if len(data) >= TRIM_AFTER_BYTES:
            # grpc just freed two copies of this request (its receive buffer and the pieces
            # it joined); hand them back now rather than after the call.
            trim()
        return request

    return decode


def take_bodies(request: object) -> list[memoryview | None] | None:
    """The bodies ``splitting_decoder`` cut out of ``request`` (None: it was decoded whole),
    taken out of the task's context: a task started later (which copies the context) must
    not keep grpc's bytes of the request alive after the call."""
    held = _SPLIT.get()
    if held is None or held[0] is not request:
        return None
    _SPLIT.set(None)
    return held[1]
