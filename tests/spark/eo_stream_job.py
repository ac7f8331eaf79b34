"""A streaming driver with the exactly-once sink, run as its own process by
test_exactly_once.py (so it can be kill -9'd).

    python eo_stream_job.py ENDPOINT SOURCE SINK CHECKPOINT

Copies the source topic to the sink topic (each copy keyed by its source message id) in small
micro-batches (10 messages) that take a while each (a sleeping UDF), until killed.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession
from pyspark.sql.functions import udf

import popmq.spark


def _slow_identity(offset: int) -> int:
    time.sleep(0.05)  # makes each micro-batch last long enough to be killed in the middle
    return offset


def exactly_once_copy(spark, endpoint: str, source: str, sink: str, checkpoint: str, slow: bool):  # type: ignore[no-untyped-def]
    """SOURCE -> SINK with exactlyOnce, keys = [source message id, source offset]."""
    stream = (
        spark.readStream.format("popmq")
        .option("endpoint", endpoint)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "10")
        .load()
    )
    if slow:
        stream = stream.withColumn("offset", udf(_slow_identity, "long")("offset"))
    return (
        stream.selectExpr("body", "array(message_id, CAST(offset AS STRING)) AS keys")
        .writeStream.format("popmq")
        .option("endpoint", endpoint)
        .option("topic", sink)
        .option("exactlyOnce", "true")
        .option("checkpointLocation", checkpoint)
    )


def main(endpoint: str, source: str, sink: str, checkpoint: str) -> None:
    from queries import run_to_end  # run as a script: tests/spark is sys.path[0]

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("popmq-eo-crash-job")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    popmq.spark.register(spark)
    print("popmq-eo-crash-job started", flush=True)
    run_to_end(exactly_once_copy(spark, endpoint, source, sink, checkpoint, slow=True).start, None)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
