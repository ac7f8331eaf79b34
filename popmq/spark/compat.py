"""The PySpark versions the connector works with (docs/spark.md, "PySpark versions")."""

from __future__ import annotations

from pyspark import __version__ as PYSPARK_VERSION

# The streaming reader's read limits (latestOffset(start, limit), pyspark.sql.streaming.
# datasource) came in PySpark 4.2.0; older versions fail on import with a less clear error.
MIN_PYSPARK = (4, 2)


def check_pyspark(version: str) -> None:
    if tuple(int(part) for part in version.split(".")[:2]) < MIN_PYSPARK:
        raise ImportError(
            "popmq's Spark connector needs PySpark >= 4.2 (its Python Data Source streaming "
            f"API); this is PySpark {version}: pip install 'popmq[spark]'"
        )


check_pyspark(PYSPARK_VERSION)
