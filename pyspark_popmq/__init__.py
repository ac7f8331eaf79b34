"""PySpark's discovery hook for format("popmq").

PySpark 4.x looks, once per session, through every installed top-level module whose name starts
with ``pyspark_`` and registers its ``DefaultSource`` (a DataSource subclass) under
``DefaultSource.name()``. Installing popmq with the spark extra is therefore enough:

    spark.read.format("popmq").option("endpoint", "127.0.0.1:8081").option("topic", "t").load()

``popmq.spark.register(spark)`` does the same explicitly (for editable installs, whose
import hooks PySpark's module scan does not see).
"""

from popmq.spark.datasource import PopmqDataSource as DefaultSource

__all__ = ["DefaultSource"]
