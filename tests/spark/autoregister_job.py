"""A user's PySpark job: a fresh SparkSession, no register call, format("popmq") everywhere.

Usage: python autoregister_job.py ENDPOINT TOPIC WORKDIR
Prints one JSON line with what each read saw. Never imports popmq itself (only Spark does;
the test helper queries.py imports no popmq).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession


def main(endpoint: str, topic: str, workdir: str) -> None:
    from queries import run_to_end  # run as a script: tests/spark is sys.path[0]

    work = Path(workdir)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("popmq-autoregister")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    common = {"endpoint": endpoint, "topic": topic}

    # Batch write, then a streaming write of a second set.
    rows = spark.createDataFrame([(f"batch-{i}".encode(),) for i in range(3)], "body binary")
    rows.write.format("popmq").options(**common).mode("append").save()
    source = work / "in"
    source.mkdir()
    (source / "part.json").write_text("\n".join(json.dumps({"b": f"stream-{i}"}) for i in range(2)))
    streamed = (
        spark.readStream.schema("b string").json(str(source))
        .selectExpr("CAST(b AS BINARY) AS body")
        .writeStream.format("popmq").options(**common)
        .option("checkpointLocation", str(work / "write-cp"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    streamed.awaitTermination()

    batch = spark.read.format("popmq").options(**common).load()
    batch_bodies = sorted(r.body.decode() for r in batch.select("body").collect())

    stream_bodies: list[str] = []
    run_to_end(
        lambda: spark.readStream.format("popmq").options(**common)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(
            lambda df, _id: stream_bodies.extend(r.body.decode() for r in df.collect())
        )
        .option("checkpointLocation", str(work / "read-cp"))
        .trigger(availableNow=True).start(),
        None,
    )  # fmt: skip
    spark.stop()
    print(json.dumps({"batch": batch_bodies, "stream": sorted(stream_bodies)}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
