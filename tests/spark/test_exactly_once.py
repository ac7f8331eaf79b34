"""option("exactlyOnce", "true"): half messages, the commit log, replays and check-backs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from popmq.broker.contract.types import Message

from popmq.client import Client
from popmq.client.checker import CheckerSession
from popmq.spark.exactly_once import (
    BatchRecord,
    CommitLog,
    TransactionalReport,
    commit_batch,
    decide,
    tag_properties,
)
from popmq.spark.options import parse_write_options

from .conftest import spark_environment
from .eo_stream_job import exactly_once_copy
from .helpers import produce, read_everything
from .queries import run_to_end

pytestmark = pytest.mark.spark


def _send_half(client: Client, topic: str, log_dir: Path, batch: int, task: str, body: bytes):  # type: ignore[no-untyped-def]
    message = Message(topic=topic, body=body)
    tag_properties(message.properties, str(log_dir), str(batch), task)
    (receipt,) = client.send([message], transactional=True)
    assert receipt.transaction_id
    return (topic, receipt.message_id, receipt.transaction_id)


def _bodies(endpoint: str, topic: str) -> list[bytes]:
    return sorted(m.body for m in read_everything(endpoint, topic))


def test_check_backs_are_answered_from_the_commit_log(
    endpoint: str, topic: str, tmp_path: Path
) -> None:
    """Orphans of a recorded task commit, of an unrecorded task or an older batch roll back,
    of a batch not decided yet stay half messages."""
    log_dir = tmp_path / "log"
    CommitLog(log_dir).write(BatchRecord(1, frozenset({"won"}), ()))
    with Client(endpoint) as client:
        _send_half(client, topic, log_dir, 1, "won", b"recorded")
        _send_half(client, topic, log_dir, 1, "lost", b"failed-attempt")
        _send_half(client, topic, log_dir, 0, "old", b"older-batch")
        _send_half(client, topic, log_dir, 2, "running", b"undecided")
        assert _bodies(endpoint, topic) == []  # half messages: nobody sees them
        with CheckerSession(client, [topic], decide) as session:
            deadline = time.monotonic() + 20
            while session.answered < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert session.answered >= 3
    assert _bodies(endpoint, topic) == [b"recorded"]


def test_commit_is_recorded_first_and_a_replay_commits_nothing_twice(
    endpoint: str, topic: str, tmp_path: Path
) -> None:
    options = parse_write_options(
        {"endpoint": endpoint, "topic": topic, "exactlyOnce": "true",
         "checkpointLocation": str(tmp_path / "cp")},
        has_topic_column=False, streaming=True,
    )  # fmt: skip
    assert options.commit_log == str(tmp_path / "cp" / "popmq-exactly-once")
    log_dir = Path(options.commit_log)
    with Client(endpoint) as client:
        first = [_send_half(client, topic, log_dir, 7, "a", b"row-%d" % i) for i in range(3)]
        # The driver died after recording batch 7, before any COMMIT; Spark re-runs batch 7.
        CommitLog(log_dir).write(BatchRecord(7, frozenset({"a"}), tuple(first)))
        again = [_send_half(client, topic, log_dir, 7, "b", b"row-%d" % i) for i in range(3)]
    report = TransactionalReport(0, 3, 1, "b", again)
    assert commit_batch(options, 7, [report, None]) == (3, 3)
    assert _bodies(endpoint, topic) == [b"row-0", b"row-1", b"row-2"]
    # A third run of the same batch id: still nothing new.
    assert commit_batch(options, 7, [report]) == (3, 3)
    assert _bodies(endpoint, topic) == [b"row-0", b"row-1", b"row-2"]


def test_exactly_once_options() -> None:
    from popmq.spark.options import OptionError

    base = {"endpoint": "h:1", "topic": "t", "exactlyOnce": "true"}
    plain = parse_write_options({"endpoint": "h:1", "topic": "t"}, False, streaming=True)
    assert not plain.exactly_once
    given = parse_write_options({**base, "commitLogDir": "file:///data/eo"}, False)
    assert given.commit_log == "/data/eo"
    with pytest.raises(OptionError, match=r"checkpointLocation.*commitLogDir"):
        parse_write_options(base, False, streaming=True)
    with pytest.raises(OptionError, match="local or mounted path"):
        parse_write_options({**base, "checkpointLocation": "hdfs://nn/cp"}, False, streaming=True)
    with pytest.raises(OptionError, match="no 'topic' column"):
        parse_write_options({**base, "commitLogDir": "/x"}, True)
    with pytest.raises(OptionError, match="must be true or false"):
        parse_write_options({**base, "exactlyOnce": "yes"}, False)


def test_batch_write_commits_all_rows_at_the_job_commit(
    spark, endpoint: str, topic: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    df = spark.createDataFrame([(f"b-{i}",) for i in range(12)], "body string").repartition(3)
    (
        df.write.format("popmq")
        .mode("append")
        .option("endpoint", endpoint)
        .option("topic", topic)
        .option("exactlyOnce", "true")
        .option("commitLogDir", str(tmp_path / "log"))
        .option("sendBatchSize", "4")
        .save()
    )
    got = read_everything(endpoint, topic)
    assert sorted(m.body for m in got) == sorted(f"b-{i}".encode() for i in range(12))
    (write_log,) = (tmp_path / "log").iterdir()  # one folder per write
    record = CommitLog(write_log).read(0)
    assert record is not None and len(record.tasks) == 3 and len(record.transactions) == 12
    assert {m.properties["popmq.spark.batch"] for m in got} == {"0"}


EO_JOB = Path(__file__).with_name("eo_stream_job.py")


def _batches(directory: Path) -> set[int]:
    if not directory.is_dir():
        return set()
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()}


@pytest.mark.slow
def test_kill_driver_mid_batch_then_restart_leaves_every_row_once(
    spark, endpoint: str, new_topic, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    source, sink = new_topic(), new_topic()
    ids = produce(endpoint, source, 60)
    checkpoint, job_log = tmp_path / "cp", tmp_path / "job.log"
    job = subprocess.Popen(
        [sys.executable, str(EO_JOB), endpoint, source, sink, str(checkpoint)],
        env={**os.environ, **spark_environment()},
        stdout=job_log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the kill takes the JVM and its Python workers along
    )
    try:
        deadline = time.monotonic() + 180
        while True:  # until a batch committed and the next one is planned, not committed
            assert job.poll() is None, job_log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the job never got mid-batch"
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
    in_flight = max(_batches(checkpoint / "offsets"))
    assert in_flight > max(_batches(checkpoint / "commits"))  # it died with a batch in flight
    visible_at_kill = read_everything(endpoint, sink)
    recorded_at_kill = {int(p.stem) for p in (checkpoint / "popmq-exactly-once").glob("*.json")}
    # At the kill, readers saw rows of recorded (committed) batches only: no half message.
    assert {int(m.keys[-1].split(":")[2]) for m in visible_at_kill} <= recorded_at_kill

    # The restart is another driver: this test's own Spark session, on the same checkpoint.
    restarted = run_to_end(
        lambda: (
            exactly_once_copy(spark, endpoint, source, sink, str(checkpoint), slow=False)
            .trigger(availableNow=True)
            .start()
        ),
        180,
    )
    assert restarted.exception() is None
    assert in_flight in _batches(checkpoint / "commits")  # the interrupted batch was redone

    copied = [m.keys[0] for m in read_everything(endpoint, sink)]
    duplicates, missing = len(copied) - len(set(copied)), len(set(ids) - set(copied))
    print(
        f"exactly-once sink: {len(ids)} rows; at the kill batch {in_flight} was in flight and "
        f"{len(visible_at_kill)} rows were visible; after the restart {len(copied)} rows, "
        f"{duplicates} duplicates, {missing} missing"
    )
    assert (duplicates, missing) == (0, 0)
    assert sorted(copied) == sorted(ids)
