"""queries.run_to_end: one more start only for a query whose Python source worker never
connected back (Spark's fixed 10 s), and only before any batch ran (no Spark run here)."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from .queries import run_to_end

NO_CONNECT = (
    "[STREAM_FAILED] Query [id = q] terminated with exception: Python worker failed to "
    "connect back. SQLSTATE: XXKST"
)


class FakeQuery:
    def __init__(self, failure: str | None, progress: list[dict[str, Any]]) -> None:
        self.failure, self.recentProgress, self.waits = failure, progress, 0

    def awaitTermination(self, timeout: float | None = None) -> bool:
        self.waits += 1
        if self.failure is not None:
            raise StreamingQueryException(message=self.failure)
        return True


def starts(*queries: FakeQuery):  # type: ignore[no-untyped-def]
    pending, started = list(queries), []

    def start() -> FakeQuery:
        started.append(pending.pop(0))
        return started[-1]

    return start, started


def test_a_query_whose_worker_never_connected_back_is_started_once_more() -> None:
    start, started = starts(FakeQuery(NO_CONNECT, []), FakeQuery(None, [{"batchId": 0}]))
    assert run_to_end(start, 60) is started[1]
    assert [q.waits for q in started] == [1, 1]


def test_a_second_failure_to_connect_back_fails() -> None:
    start, started = starts(FakeQuery(NO_CONNECT, []), FakeQuery(NO_CONNECT, []))
    with pytest.raises(StreamingQueryException, match="connect back"):
        run_to_end(start, 60)
    assert len(started) == 2


@pytest.mark.parametrize(
    ("failure", "progress"),
    [
        ("the sink is down", []),  # any other failure
        (NO_CONNECT, [{"batchId": 0}]),  # a batch ran: not a failed start
    ],
)
def test_other_failures_are_not_retried(failure: str, progress: list[dict[str, Any]]) -> None:
    start, started = starts(FakeQuery(failure, progress), FakeQuery(None, []))
    with pytest.raises(StreamingQueryException):
        run_to_end(start, 60)
    assert len(started) == 1
