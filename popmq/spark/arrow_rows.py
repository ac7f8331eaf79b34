"""Messages <-> Arrow record batches (read() yields batches; the Arrow writer gets them)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from popmq.broker.contract.types import Message
from popmq.client.model import ReceivedMessage

_TS_MS = pa.timestamp("ms", tz="UTC")
_TS_US = pa.timestamp("us", tz="UTC")  # Spark's TimestampType in Arrow

READ_ARROW_FIELDS = [
    pa.field("topic", pa.string(), False),
    pa.field("broker", pa.string(), False),
    pa.field("queue_id", pa.int32(), False),
    pa.field("offset", pa.int64(), False),
    pa.field("message_id", pa.string(), False),
    pa.field("tag", pa.string(), True),
    pa.field("keys", pa.list_(pa.field("element", pa.string(), False)), False),
    pa.field("properties", pa.map_(pa.string(), pa.field("value", pa.string(), False)), False),
    pa.field("body", pa.binary(), False),
    pa.field("born_timestamp", _TS_US, True),
    pa.field("store_timestamp", _TS_US, True),
    pa.field("delivery_attempt", pa.int32(), False),
]
READ_ARROW_SCHEMA = pa.schema(READ_ARROW_FIELDS)
POP_ARROW_SCHEMA = pa.schema([*READ_ARROW_FIELDS, pa.field("receipt_handle", pa.string(), False)])


def _timestamps(values: list[int]) -> pa.Array:
    # 0 means "not set" on the wire: a null is more honest than 1970-01-01.
    return pa.array([v or None for v in values], _TS_MS).cast(_TS_US)


def messages_to_batch(messages: Sequence[ReceivedMessage], pop: bool = False) -> pa.RecordBatch:
    schema = POP_ARROW_SCHEMA if pop else READ_ARROW_SCHEMA
    columns = [
        pa.array([m.topic for m in messages], pa.string()),
        pa.array([m.broker for m in messages], pa.string()),
        pa.array([m.queue_id for m in messages], pa.int32()),
        pa.array([m.offset for m in messages], pa.int64()),
        pa.array([m.message_id for m in messages], pa.string()),
        pa.array([m.tag or None for m in messages], pa.string()),
        pa.array([m.keys for m in messages], schema.field("keys").type),
        pa.array([list(m.properties.items()) for m in messages], schema.field("properties").type),
        pa.array([m.body for m in messages], pa.binary()),
        _timestamps([m.born_timestamp_ms for m in messages]),
        _timestamps([m.store_timestamp_ms for m in messages]),
        pa.array([m.delivery_attempt for m in messages], pa.int32()),
    ]
    if pop:
        columns.append(pa.array([m.receipt_handle for m in messages], pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class BatchBuffer:
    """Collects messages and cuts a record batch every `rows` messages or `bytes` of body."""

    def __init__(self, pop: bool, rows: int = 8192, body_bytes: int = 16 << 20) -> None:
        self.pop = pop
        self.rows = rows
        self.body_bytes = body_bytes
        self._messages: list[ReceivedMessage] = []
        self._bytes = 0

    def add(self, messages: Sequence[ReceivedMessage]) -> Iterator[pa.RecordBatch]:
        for message in messages:
            self._messages.append(message)
            self._bytes += len(message.body)
            if len(self._messages) >= self.rows or self._bytes >= self.body_bytes:
                yield self.flush()

    def flush(self) -> pa.RecordBatch:
        batch = messages_to_batch(self._messages, self.pop)
        self._messages, self._bytes = [], 0
        return batch

    def __len__(self) -> int:
        return len(self._messages)


def _column(batch: pa.RecordBatch, name: str) -> list | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index).to_pylist()


def batch_to_messages(batch: pa.RecordBatch, default_topic: str) -> list[Message]:
    """One Message per row of a record batch whose columns passed check_write_schema."""
    count = batch.num_rows
    bodies = _column(batch, "body") or [None] * count
    topics = _column(batch, "topic") or [None] * count
    tags = _column(batch, "tag") or [None] * count
    keys = _column(batch, "keys") or [None] * count
    properties = _column(batch, "properties") or [None] * count
    groups = _column(batch, "message_group") or [None] * count
    delivery_index = batch.schema.get_field_index("delivery_timestamp")
    delivery: list[int | None] = [None] * count
    if delivery_index >= 0:
        column = batch.column(delivery_index)
        if pa.types.is_timestamp(column.type):
            # Truncate to milliseconds (a plain cast refuses to drop the microseconds).
            per_ms = {"s": 1 / 1000, "ms": 1, "us": 1000, "ns": 1_000_000}[column.type.unit]
            raw = column.cast(pa.int64()).to_pylist()
            delivery = [None if v is None else int(v // per_ms) for v in raw]
        else:
            delivery = column.to_pylist()

    messages = []
    for row in range(count):
        body = bodies[row]
        if body is None:
            raise ValueError(f"row {row}: body is null; every message needs a body")
        topic = topics[row] or default_topic
        if not topic:
            raise ValueError(f"row {row}: topic is null and no 'topic' option is set")
        row_keys = keys[row]
        if isinstance(row_keys, str):
            row_keys = [row_keys]
        row_properties = properties[row]
        messages.append(
            Message(
                topic=topic,
                body=body.encode() if isinstance(body, str) else body,
                tag=tags[row] or "",
                keys=[k for k in row_keys or [] if k],
                properties=dict(row_properties) if row_properties else {},
                message_group=groups[row] or "",
                delivery_timestamp_ms=delivery[row] or 0,
            )
        )
    return messages
