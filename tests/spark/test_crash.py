"""kill -9 of the driver in the middle of a micro-batch, then a restart: exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import spark_environment
from .helpers import produce
from .queries import run_to_end

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = Path(__file__).with_name("stream_job.py")


def _batches(directory: Path) -> set[int]:
    if not directory.is_dir():
        return set()
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()}


def _start_job(endpoint: str, topic: str, checkpoint: Path, out: Path, log: Path):  # type: ignore[no-untyped-def]
    # Its own session, so the kill takes the JVM and the Python workers with it, like a
    # driver machine going away.
    return subprocess.Popen(
        [sys.executable, str(JOB), endpoint, topic, str(checkpoint), str(out)],
        env={**os.environ, **spark_environment()},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_kill_driver_mid_batch_then_restart_is_exactly_once(
    spark, endpoint: str, topic: str, tmp_path: Path
) -> None:
    ids = produce(endpoint, topic, 120)
    checkpoint, out, log = tmp_path / "cp", tmp_path / "out", tmp_path / "job.log"

    job = _start_job(endpoint, topic, checkpoint, out, log)
    try:
        # Wait until a batch committed and the next one is planned but not committed.
        # Generous: a driver's JVM and first batches took over 120 s on a machine at load 21.
        deadline = time.monotonic() + 300
        while True:
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"never mid-batch: {log.read_text()[-3000:]}"
            planned, committed = _batches(checkpoint / "offsets"), _batches(checkpoint / "commits")
            if committed and planned and max(planned) > max(committed):
                break
            time.sleep(0.02)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
    planned, committed = _batches(checkpoint / "offsets"), _batches(checkpoint / "commits")
    assert max(planned) > max(committed)  # it really died with a batch in flight
    in_flight = max(planned)

    # The restart is another driver: this test's own Spark session, on the same checkpoint.
    restarted = run_to_end(
        lambda: (
            spark.readStream.format("popmq")
            .option("endpoint", endpoint)
            .option("topic", topic)
            .option("startingOffsets", "earliest")
            .option("maxMessagesPerTrigger", "20")
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        ),
        180,
    )
    assert restarted.exception() is None
    assert in_flight in _batches(checkpoint / "commits")  # the interrupted batch was redone

    stored = [r.message_id for r in spark.read.parquet(str(out)).select("message_id").collect()]
    assert len(stored) == len(ids)
    assert sorted(stored) == sorted(ids)
