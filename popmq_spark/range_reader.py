"""Reading one QueueRange with PullMessage, on an executor, as Arrow record batches."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pyarrow as pa

from broker.api.errors import Code
from popmq.client import Client, OffsetPolicy, ProxyError, QueueRef
from popmq_spark.arrow_rows import BatchBuffer
from popmq_spark.partitions import QueueRange

log = logging.getLogger(__name__)

# The range was planned from the queue's end offset, so its messages exist. A pull that
# still finds nothing (a broker restarting) is retried this many times before giving up.
EMPTY_PULL_RETRIES = 20
EMPTY_PULL_PAUSE_S = 0.25


class DataLossError(RuntimeError):
    """Messages a stream was about to read are gone (retention, or a recreated topic)."""


def read_range(part: QueueRange) -> Iterator[pa.RecordBatch]:
    settings = part.settings
    queue = QueueRef(settings.topic, part.broker, part.queue_id, settings.connection.endpoint)
    buffer = BatchBuffer(pop=False)
    with Client(settings.connection.endpoint, settings.connection.timeout_ms / 1000) as client:
        offset, empty_pulls = part.start, 0
        while offset < part.end:
            try:
                result = client.pull(
                    queue,
                    offset,
                    batch_size=min(settings.pull_batch_size, part.end - offset),
                    filter_expression=settings.filter_expression,
                    group=settings.group,
                )
            except ProxyError as error:
                if error.code != Code.ILLEGAL_OFFSET:
                    raise
                offset = _after_lost_offsets(client, queue, part, offset, error)
                continue
            if result.next_offset <= offset:
                empty_pulls += 1
                if empty_pulls > EMPTY_PULL_RETRIES:
                    raise RuntimeError(
                        f"popmq: queue {part.broker}/{part.queue_id} of {settings.topic} returns "
                        f"nothing at offset {offset} although the range ends at {part.end}"
                    )
                time.sleep(EMPTY_PULL_PAUSE_S)
                continue
            empty_pulls = 0
            # A pull may run past the range end; those belong to the next batch.
            yield from buffer.add([m for m in result.messages if m.offset < part.end])
            offset = result.next_offset
    if len(buffer):
        yield buffer.flush()


def _after_lost_offsets(
    client: Client, queue: QueueRef, part: QueueRange, offset: int, error: ProxyError
) -> int:
    """Where to go on after ILLEGAL_OFFSET at `offset`: the queue's first offset if retention
    purged ours (data loss unless allowed), or the range end if the queue is shorter now."""
    first = client.query_offset(queue, OffsetPolicy.BEGINNING)
    last = client.query_offset(queue, OffsetPolicy.END)
    where = f"queue {part.broker}/{part.queue_id} of topic {queue.topic}"
    if offset < first:
        lost = min(first, part.end) - offset
        if part.settings.fail_on_data_loss and not part.from_earliest:
            raise DataLossError(
                f"popmq: {lost} message(s) of {where} from offset {offset} are gone (retention "
                f"removed them; the queue now starts at {first}). Set failOnDataLoss=false to "
                f"skip them. ({error.message})"
            )
        if not part.from_earliest:
            log.warning("skipping %d lost message(s) of %s at offset %d", lost, where, offset)
        return first
    if offset >= last:
        if part.settings.fail_on_data_loss:
            raise DataLossError(
                f"popmq: {where} ends at {last} but the range asks for [{offset}, {part.end}): "
                f"was the topic recreated? Set failOnDataLoss=false to skip. ({error.message})"
            )
        log.warning("%s ends at %d; skipping [%d, %d)", where, last, offset, part.end)
        return part.end
    raise error
