"""One SparkSession and one popmq server for the whole Spark suite (both are slow to start).

Spark: local[2] (the machine has two cores), no UI, worker Python = this interpreter, and no
register call: format("popmq") is found by PySpark's own scan for `pyspark_*` modules, as in a
user's install. This checkout is installed editable, through an import hook that the scan
(pkgutil.iter_modules over sys.path) cannot see, so the workers get a PYTHONPATH entry holding
just a link to pyspark_popmq (test_autoregister.py checks a real non-editable install).
popmq: `popmq serve` with 2 embedded brokers, topics created explicitly (auto-create off, so
an unknown topic is an error), short minimum long-polling and invisible times for pop tests.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from popmq.client.local_server import LocalServer

# py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after
# pytest closed the stream it logs to: a "Logging error" traceback at the end of every run.
logging.getLogger("py4j").setLevel(logging.WARNING)

SERVER_SETTINGS = {
    "broker.topics.auto_create": "false",
    "proxy.min_long_polling_ms": 100,
    "proxy.min_invisible_ms": 500,
    "broker.pop.min_invisible_ms": 500,
    "broker.pop.time_scale": 0.01,  # retry backoff "1s" becomes 10 ms
    # Orphaned half messages of the exactly-once sink are checked back within a second.
    "broker.transaction.check_immunity_ms": 500,
    "broker.transaction.check_interval_ms": 500,
    "proxy.transaction_check_poll_ms": 100,
}
QUEUES_PER_BROKER = 2


REPO = Path(__file__).resolve().parents[2]


def _discovery_path() -> str:
    """A directory whose only module is (a link to) pyspark_popmq, for PySpark's scan."""
    folder = Path(tempfile.mkdtemp(prefix="popmq-spark-discovery-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    (folder / "pyspark_popmq").symlink_to(REPO / "pyspark_popmq", target_is_directory=True)
    return str(folder)


DISCOVERY_PATH = _discovery_path()


def spark_environment() -> dict[str, str]:
    return {
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": DISCOVERY_PATH,
    }


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    os.environ.update(spark_environment())
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("popmq-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    try:
        session = builder.getOrCreate()
    except PySparkRuntimeError as exc:
        # PySpark forks its Java gateway with a Python preexec_fn; in this test worker, after
        # other tests left gRPC's threads running, the child can die before exec (a rehearsal
        # lost the whole Spark suite to one JAVA_GATEWAY_EXITED). A user's Spark driver has
        # no such neighbours. One more launch, said in the log; a second failure is real.
        if "JAVA_GATEWAY_EXITED" not in str(exc):
            raise
        logging.getLogger(__name__).warning("Spark's Java gateway exited at launch; once more")
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def popmq_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    data = tmp_path_factory.mktemp("popmq-spark-server")
    with LocalServer(data, brokers=2, settings=SERVER_SETTINGS) as server:
        yield server


@pytest.fixture
def endpoint(popmq_server: LocalServer) -> str:
    return popmq_server.endpoint


@pytest.fixture
def topic(popmq_server: LocalServer) -> str:
    """A fresh topic with 2 queues on each of the 2 brokers."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    popmq_server.create_topic(name, queues=QUEUES_PER_BROKER)
    return name


@pytest.fixture
def new_topic(popmq_server: LocalServer):  # type: ignore[no-untyped-def]
    def make() -> str:
        name = f"t-{uuid.uuid4().hex[:10]}"
        popmq_server.create_topic(name, queues=QUEUES_PER_BROKER)
        return name

    return make
