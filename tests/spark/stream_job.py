"""A streaming driver run as its own process by test_crash.py (so it can be kill -9'd).

    python stream_job.py ENDPOINT TOPIC CHECKPOINT OUT

Small micro-batches (20 messages) that take a while each (a sleeping UDF), until killed.
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


def main(endpoint: str, topic: str, checkpoint: str, out: str) -> None:
    from queries import run_to_end  # run as a script: tests/spark is sys.path[0]

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
    writer = (
        stream.withColumn("offset", udf(_slow_identity, "long")("offset"))
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
    )
    print("popmq-crash-job started", flush=True)
    run_to_end(writer.start, None)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
