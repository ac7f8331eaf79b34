"""kill -9 of the driver in the middle of a micro-batch, then a restart: exactly once.

One driver process runs two queries over one topic (a JVM start is the slow part): Parquet
output, and a copy through the exactly-once popmq sink. It is killed once both are in the
middle of a batch; each test restarts one query from its checkpoint in this suite's session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from popmq.client.local_server import LocalServer

from .conftest import QUEUES_PER_BROKER, spark_environment
from .helpers import produce, read_everything
from .stream_job import exactly_once_copy

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = Path(__file__).with_name("stream_job.py")
MESSAGES = 120


def _batches(directory: Path) -> set[int]:
    if not directory.is_dir():
        return set()
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()}


def _mid_batch(checkpoint: Path) -> bool:
    """A batch committed, and the next one is planned but not committed."""
    planned, committed = _batches(checkpoint / "offsets"), _batches(checkpoint / "commits")
    return bool(committed and planned and max(planned) > max(committed))


@dataclass
class KilledJob:
    endpoint: str
    topic: str
    ids: list[str]
    checkpoint: Path
    out: Path
    sink: str
    eo_checkpoint: Path
    visible_at_kill: list[str]  # write keys in the sink topic when the driver died
    recorded_at_kill: set[int]  # batches in the sink's commit log then


@pytest.fixture(scope="module")
def killed_job(spark, popmq_server: LocalServer, tmp_path_factory) -> KilledJob:  # type: ignore[no-untyped-def]
    endpoint = popmq_server.endpoint
    topic, sink = f"crash-{os.getpid()}", f"crash-eo-{os.getpid()}"
    popmq_server.create_topic(topic, queues=QUEUES_PER_BROKER)
    popmq_server.create_topic(sink, queues=QUEUES_PER_BROKER)
    ids = produce(endpoint, topic, MESSAGES)
    work = tmp_path_factory.mktemp("crash")
    checkpoint, out, eo_checkpoint = work / "cp", work / "out", work / "eo-cp"
    log = work / "job.log"
    # Its own session, so the kill takes the JVM and the Python workers with it, like a
    # driver machine going away.
    job = subprocess.Popen(
        [sys.executable, str(JOB), endpoint, topic, str(checkpoint), str(out), sink,
         str(eo_checkpoint)],
        env={**os.environ, **spark_environment()},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not (_mid_batch(checkpoint) and _mid_batch(eo_checkpoint)):
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the job never got mid-batch"
            time.sleep(0.02)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
    return KilledJob(
        endpoint, topic, ids, checkpoint, out, sink, eo_checkpoint,
        [m.keys[-1] for m in read_everything(endpoint, sink)],
        {int(p.stem) for p in (eo_checkpoint / "popmq-exactly-once").glob("*.json")},
    )  # fmt: skip


def test_kill_driver_mid_batch_then_restart_is_exactly_once(spark, killed_job: KilledJob) -> None:
    job = killed_job
    planned, committed = _batches(job.checkpoint / "offsets"), _batches(job.checkpoint / "commits")
    assert max(planned) > max(committed)  # it really died with a batch in flight
    in_flight = max(planned)

    # The restart is another driver: this test's own Spark session, on the same checkpoint.
    restarted = (
        spark.readStream.format("popmq")
        .option("endpoint", job.endpoint)
        .option("topic", job.topic)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "20")
        .load()
        .writeStream.format("parquet")
        .option("path", str(job.out))
        .option("checkpointLocation", str(job.checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    restarted.awaitTermination(180)
    assert restarted.exception() is None
    assert in_flight in _batches(job.checkpoint / "commits")  # the interrupted batch was redone

    stored = [r.message_id for r in spark.read.parquet(str(job.out)).select("message_id").collect()]
    assert len(stored) == len(job.ids)
    assert sorted(stored) == sorted(job.ids)


def test_exactly_once_sink_after_kill_and_restart_has_every_row_once(
    spark, killed_job: KilledJob
) -> None:
    job = killed_job
    planned = _batches(job.eo_checkpoint / "offsets")
    committed = _batches(job.eo_checkpoint / "commits")
    in_flight = max(planned)
    assert in_flight > max(committed)  # it died with a batch in flight
    # At the kill, readers saw rows of recorded (committed) batches only: no half message.
    assert {int(key.split(":")[2]) for key in job.visible_at_kill} <= job.recorded_at_kill

    restarted = (
        exactly_once_copy(spark, job.endpoint, job.topic, job.sink, str(job.eo_checkpoint), False)
        .trigger(availableNow=True)
        .start()
    )
    restarted.awaitTermination(180)
    assert restarted.exception() is None
    assert in_flight in _batches(job.eo_checkpoint / "commits")  # the batch was redone

    copied = [m.keys[0] for m in read_everything(job.endpoint, job.sink)]
    duplicates, missing = len(copied) - len(set(copied)), len(set(job.ids) - set(copied))
    print(
        f"exactly-once sink: {len(job.ids)} rows; at the kill batch {in_flight} was in flight "
        f"and {len(job.visible_at_kill)} rows were visible; after the restart {len(copied)} "
        f"rows, {duplicates} duplicates, {missing} missing"
    )
    assert (duplicates, missing) == (0, 0)
    assert sorted(copied) == sorted(job.ids)
