"""Per-queue offsets: resolving user specs through the proxy, Spark's offset dicts, limits.

A queue is (broker name, queue id). Spark keeps stream offsets as JSON in its checkpoint; ours
look like {"broker-a": {"0": 42, "1": 17}, "broker-b": {"0": 3}}.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from popmq.client import Client, OffsetPolicy, QueueRef
from popmq.spark.options import EARLIEST_SENTINEL, LATEST_SENTINEL, OffsetSpec, OptionError

QueueKey = tuple[str, int]
Offsets = dict[QueueKey, int]
# Any queue key: (broker, queue_id), or (topic, broker, queue_id) for multi-topic streams.
K = TypeVar("K", bound=tuple[str | int, ...])


def to_spark(offsets: Mapping[QueueKey, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (broker, queue_id), offset in sorted(offsets.items()):
        out.setdefault(broker, {})[str(queue_id)] = int(offset)
    return out


def from_spark(data: Mapping[str, Mapping[str, int]]) -> Offsets:
    return {
        (broker, int(queue_id)): int(offset)
        for broker, queues in data.items()
        for queue_id, offset in queues.items()
    }


def describe(key: QueueKey) -> str:
    return f"{key[0]}/{key[1]}"


def resolve(
    client: Client, queues: Sequence[QueueRef], spec: OffsetSpec, option: str, default: str
) -> Offsets:
    """Concrete offsets for every queue; `default` ('earliest'/'latest') fills queues that a
    per-queue JSON spec leaves out. Unknown queues in the JSON are an error, not ignored."""
    if spec.kind == "timestamp":
        return client.query_offsets(queues, OffsetPolicy.TIMESTAMP, spec.timestamp_ms)
    if spec.kind in ("earliest", "latest"):
        policy = OffsetPolicy.BEGINNING if spec.kind == "earliest" else OffsetPolicy.END
        return client.query_offsets(queues, policy)

    wanted = spec.queue_offsets()
    known = {q.key for q in queues}
    if spec.kind == "timestamps":
        # startingOffsetsByTimestamp: each named queue from its first message at or after its
        # timestamp; the sentinels still mean earliest / latest.
        by_key = {q.key: q for q in queues}
        wanted = {
            key: stamp
            if stamp in (EARLIEST_SENTINEL, LATEST_SENTINEL) or key not in by_key
            else client.query_offset(by_key[key], OffsetPolicy.TIMESTAMP, stamp)
            for key, stamp in wanted.items()
        }
    unknown = sorted(set(wanted) - known)
    if unknown:
        raise OptionError(
            f"{option} names queue(s) {', '.join(map(describe, unknown))} that the topic does "
            f"not have; its queues are {', '.join(map(describe, sorted(known)))}"
        )
    begin = client.query_offsets(queues, OffsetPolicy.BEGINNING)
    end = client.query_offsets(queues, OffsetPolicy.END)
    default_sentinel = EARLIEST_SENTINEL if default == "earliest" else LATEST_SENTINEL
    result: Offsets = {}
    for key in sorted(known):
        offset = wanted.get(key, default_sentinel)
        if offset == EARLIEST_SENTINEL:
            offset = begin[key]
        elif offset == LATEST_SENTINEL:
            offset = end[key]
        elif offset > end[key]:
            raise OptionError(
                f"{option}: offset {offset} of queue {describe(key)} is past its end ({end[key]})"
            )
        result[key] = offset
    return result


def cap_total(start: Mapping[K, int], latest: Mapping[K, int], limit: int) -> dict[K, int]:
    """Admission control: move at most `limit` messages past `start`, shared between queues in
    proportion to their backlog (like Kafka's maxOffsetsPerTrigger), deterministically."""
    backlog = {k: max(latest[k] - start.get(k, 0), 0) for k in sorted(latest)}
    total = sum(backlog.values())
    if total <= limit:
        return dict(latest)
    share = {k: (n * limit) // total for k, n in backlog.items()}
    # Hand the rounding remainder out one by one, biggest backlog first, so the whole limit
    # is used and every trigger makes progress even when each share rounds down to zero.
    remainder = limit - sum(share.values())
    for key in sorted(backlog, key=lambda k: (-(backlog[k] - share[k]), k)):
        if remainder <= 0:
            break
        if backlog[key] > share[key]:
            share[key] += 1
            remainder -= 1
    # A queue missing from `start` is new: streams read new queues from offset 0.
    capped = {k: min(start.get(k, 0) + share[k], latest[k]) for k in latest}
    return {**start, **capped}
