"""Running a streaming query to its end in the Spark tests, past one of Spark's start limits.

A streaming query on a Python data source (format("popmq")) starts a Python process that
serves the source to the driver, and Spark waits 10 s for it to connect back: a constant in
PythonWorkerFactory.createSimpleWorker, no setting changes it. That process imports PySpark
and pyarrow first (about 0.3 s of CPU); on a machine loaded far past its 2 cores the import took
longer than 10 s and a query failed before its first batch, in INITIALIZING, with "Python
worker failed to connect back" (a loaded run of `make test`, tests/spark/test_read.py). popmq's
code had not run yet. Such a query is started once more, said in the log; any other failure,
a failure after a batch ran, or a second failure fails the test.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

CONNECT_BACK = "Python worker failed to connect back"

log = logging.getLogger(__name__)


def _failed_to_start(exc: BaseException, query: Any) -> bool:
    return CONNECT_BACK in str(exc) and not query.recentProgress


def run_to_end(start: Callable[[], Any], timeout_s: float | None = 120) -> Any:
    """start() a query (`DataStreamWriter.start`) and wait up to timeout_s for it to end;
    returns the query that ran. A failed query raises, as `awaitTermination` does."""
    from pyspark.errors import StreamingQueryException

    query = start()
    try:
        query.awaitTermination(timeout_s)
    except StreamingQueryException as exc:
        if not _failed_to_start(exc, query):
            raise
        log.warning("Spark's Python source worker did not connect back in 10 s; once more")
        query = start()
        query.awaitTermination(timeout_s)
    return query
