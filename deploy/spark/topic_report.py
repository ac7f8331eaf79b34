"""Example Spark job: read a popmq topic, aggregate per tag and minute, write Parquet.

Batch (everything in the topic now):

    spark-submit --master 'local[2]' deploy/spark/topic_report.py \\
        --endpoint 127.0.0.1:8081 --topic orders --out /tmp/orders-report

Streaming (offsets kept in the checkpoint; rerun to pick up new messages):

    spark-submit --master 'local[2]' deploy/spark/topic_report.py --stream \\
        --endpoint 127.0.0.1:8081 --topic orders --out /tmp/orders-report \\
        --checkpoint /tmp/orders-report-checkpoint

The machine that runs the executors needs popmq installed (pip install 'popmq[spark]'), so
the workers can import the connector.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import popmq.spark


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="popmq proxy HOST:PORT")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True, help="Parquet output directory")
    parser.add_argument("--stream", action="store_true", help="Structured Streaming run")
    parser.add_argument("--checkpoint", help="streaming checkpoint directory (--stream)")
    parser.add_argument("--starting-offsets", default="earliest")
    parser.add_argument("--max-messages-per-trigger", type=int, default=100_000)
    args = parser.parse_args(argv)
    if args.stream and not args.checkpoint:
        parser.error("--stream needs --checkpoint")
    return args


def report(messages: Any) -> Any:
    """Messages per tag and minute (by store time), with bytes and the time span seen."""
    from pyspark.sql import functions as F

    return messages.groupBy(
        F.coalesce("tag", F.lit("(none)")).alias("tag"),
        F.window("store_timestamp", "1 minute").alias("minute"),
    ).agg(
        F.count("*").alias("messages"),
        F.sum(F.length("body")).alias("body_bytes"),
        # approx: exact distinct counts are not supported on streams.
        F.approx_count_distinct(F.concat_ws("/", "broker", "queue_id")).alias("queues"),
        F.max("delivery_attempt").alias("max_delivery_attempt"),
    )


def run(spark: Any, args: argparse.Namespace) -> None:
    popmq.spark.register(spark)
    if not args.stream:
        messages = (
            spark.read.format("popmq")
            .option("endpoint", args.endpoint)
            .option("topic", args.topic)
            .option("startingOffsets", args.starting_offsets)
            .load()
        )
        report(messages).write.mode("overwrite").parquet(args.out)
        return

    from pyspark.sql import functions as F

    # A stream can only append finished windows: the watermark says when a minute is done.
    messages = (
        spark.readStream.format("popmq")
        .option("endpoint", args.endpoint)
        .option("topic", args.topic)
        .option("startingOffsets", args.starting_offsets)
        .option("maxMessagesPerTrigger", str(args.max_messages_per_trigger))
        .load()
        .withWatermark("store_timestamp", "1 minute")
    )
    query = (
        report(messages)
        .withColumn("minute_start", F.col("minute.start"))
        .writeStream.format("parquet")
        .outputMode("append")
        .option("path", args.out)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"popmq-topic-report-{args.topic}").getOrCreate()
    try:
        run(spark, args)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
