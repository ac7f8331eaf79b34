"""popmq's Spark connector: format("popmq") for PySpark's Python Data Source API (>= 4.2).

    # installed with pip, PySpark finds format("popmq") by itself (the pyspark_popmq module);
    # popmq.spark.register(spark) does it explicitly (editable installs, old code).
    df = spark.read.format("popmq").option("endpoint", "127.0.0.1:8081") \\
        .option("topic", "orders").load()

See docs/spark.md for the options, the schema and the delivery guarantees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from popmq.spark.compat import MIN_PYSPARK  # first: refuses too old a PySpark
from popmq.spark.datasource import PopmqDataSource
from popmq.spark.options import OptionError
from popmq.spark.pop_ack import AckReport, ack_messages, pop_foreach_batch
from popmq.spark.range_reader import DataLossError
from popmq.spark.topology import TopicNotFoundError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMAT = "popmq"


def register(spark: SparkSession) -> None:
    """Make format("popmq") available in this SparkSession (PySpark's own scan of installed
    `pyspark_*` modules already does, except for editable installs)."""
    spark.dataSource.register(PopmqDataSource)


__all__ = [
    "FORMAT",
    "MIN_PYSPARK",
    "AckReport",
    "DataLossError",
    "OptionError",
    "PopmqDataSource",
    "TopicNotFoundError",
    "ack_messages",
    "pop_foreach_batch",
    "register",
]
