"""A streaming driver run as its own process by test_crash.py (so it can be kill -9'd).

    python stream_job.py ENDPOINT TOPIC CHECKPOINT OUT [SINK EO_CHECKPOINT]

Small micro-batches (20 messages) that take a while each (a sleeping UDF), until killed,
written as Parquet. With SINK, a second query in the same driver copies TOPIC to the SINK topic
through the exactly-once sink (10 messages a batch), so one kill tests both.
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
    """TOPIC -> SINK with exactlyOnce, each copy keyed by its source message id."""
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


def main(
    endpoint: str, topic: str, checkpoint: str, out: str, sink: str = "", eo_checkpoint: str = ""
) -> None:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("popmq-crash-job")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    popmq.spark.register(spark)
    stream = (
        spark.readStream.format("popmq")
        .option("endpoint", endpoint)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "20")
        .load()
    )
    query = (
        stream.withColumn("offset", udf(_slow_identity, "long")("offset"))
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    if sink:
        exactly_once_copy(spark, endpoint, topic, sink, eo_checkpoint, slow=True).start()
    print("popmq-crash-job started", flush=True)
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:7])
