"""Reading one QueueRange with PullMessage, on an executor, as Arrow record batches.

The range is cut into windows of pullBatchSize offsets and up to pullConcurrency windows are
pulled at once (the proxy answers at most 32 messages per pull, so one pull at a time leaves
it idle between round trips). Windows are consumed in order, so rows come out in offset order.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa

from popmq.broker.contract.errors import Code
from popmq.client import Client, OffsetPolicy, ProxyError, QueueRef, ReceivedMessage
from popmq.errors import PopmqError
from popmq.spark.arrow_rows import BatchBuffer
from popmq.spark.partitions import QueueRange

log = logging.getLogger(__name__)

# The range was planned from the queue's end offset, so its messages exist. A pull that
# still finds nothing (a broker restarting) is retried this many times before giving up.
EMPTY_PULL_RETRIES = 20
EMPTY_PULL_PAUSE_S = 0.25


class DataLossError(PopmqError, RuntimeError):
    """Messages a stream was about to read are gone (retention, or a recreated topic)."""


def read_range(part: QueueRange) -> Iterator[pa.RecordBatch]:
    settings = part.settings
    queue = QueueRef(settings.topic, part.broker, part.queue_id, settings.connection.endpoint)
    buffer = BatchBuffer(pop=False)
    timeout_s = settings.connection.timeout_ms / 1000
    with (
        Client(
            settings.connection.endpoint, timeout_s, security=settings.connection.security
        ) as client,
        ThreadPoolExecutor(settings.pull_concurrency, "popmq-pull") as pool,
    ):
        offset = part.start
        while offset < part.end:
            try:
                for messages, reached in _windows(pool, client, queue, part, offset):
                    yield from buffer.add(messages)
                    offset = reached
            except ProxyError as error:
                if error.code != Code.ILLEGAL_OFFSET:
                    raise
                # `offset` is where the failing window starts: windows complete in order.
                offset = _after_lost_offsets(client, queue, part, offset, error)
            except _QueueEnded as ended:
                offset = _after_lost_offsets(client, queue, part, ended.offset, ended.error)
    if len(buffer):
        yield buffer.flush()


def _windows(
    pool: ThreadPoolExecutor, client: Client, queue: QueueRef, part: QueueRange, start: int
) -> Iterator[tuple[list[ReceivedMessage], int]]:
    """(messages, window end) for consecutive windows from `start`, several in flight."""
    size = part.settings.pull_batch_size
    bounds = ((a, min(a + size, part.end)) for a in range(start, part.end, size))
    pending: deque[tuple[Future[tuple[list[ReceivedMessage], int]], int]] = deque()

    def submit() -> None:
        window = next(bounds, None)
        if window is not None:
            pending.append((pool.submit(_pull_window, client, queue, part, *window), window[1]))

    try:
        for _ in range(part.settings.pull_concurrency):
            submit()
        while pending:
            future, window_end = pending.popleft()
            messages, reached = future.result()
            if reached < window_end:  # the queue ended inside this window
                yield messages, reached
                raise _QueueEnded(reached)
            submit()
            yield messages, window_end
    finally:
        for future, _ in pending:  # a failure or an abandoned read: stop what is queued
            future.cancel()


def _pull_window(
    client: Client, queue: QueueRef, part: QueueRange, first: int, end: int
) -> tuple[list[ReceivedMessage], int]:
    """The messages with offsets in [first, end) (normally one pull), and where it stopped:
    `end`, or the queue's end offset when the queue ends inside the window."""
    settings = part.settings
    messages: list[ReceivedMessage] = []
    offset, empty_pulls = first, 0
    while offset < end:
        result = client.pull(
            queue,
            offset,
            batch_size=end - offset,
            filter_expression=settings.filter_expression,
            group=settings.group,
        )
        if result.next_offset <= offset:
            if client.query_offset(queue, OffsetPolicy.END) <= offset:
                return messages, offset  # the queue is shorter than the planned range
            empty_pulls += 1
            if empty_pulls > EMPTY_PULL_RETRIES:
                raise RuntimeError(
                    f"popmq: queue {part.broker}/{part.queue_id} of {settings.topic} returns "
                    f"nothing at offset {offset} although the range ends at {part.end}"
                )
            time.sleep(EMPTY_PULL_PAUSE_S)
            continue
        empty_pulls = 0
        # With a tag filter a pull can run past the window; those belong to the next one.
        messages += [m for m in result.messages if m.offset < end]
        offset = result.next_offset
    return messages, end


class _QueueEnded(Exception):
    def __init__(self, offset: int) -> None:
        super().__init__(f"the queue ends at offset {offset}")
        self.offset = offset
        self.error = ProxyError(Code.ILLEGAL_OFFSET, f"the queue ends at offset {offset}")


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
