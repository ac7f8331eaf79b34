"""deploy/spark/topic_report.py, run in this test's Spark session (not through spark-submit)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from .helpers import produce

pytestmark = pytest.mark.spark

JOB = Path(__file__).resolve().parents[2] / "deploy" / "spark" / "topic_report.py"


def _job():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("topic_report", JOB)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_batch_report_counts_messages_per_tag(
    spark, endpoint: str, topic: str, tmp_path: Path
) -> None:
    produce(endpoint, topic, 21)  # tags alternate: 11 "even", 10 "odd"
    job = _job()
    out = tmp_path / "report"
    job.run(spark, job.parse_args(["--endpoint", endpoint, "--topic", topic, "--out", str(out)]))
    rows = spark.read.parquet(str(out)).groupBy("tag").sum("messages").collect()
    assert {r["tag"]: r["sum(messages)"] for r in rows} == {"even": 11, "odd": 10}
