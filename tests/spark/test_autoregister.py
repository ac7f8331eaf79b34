"""format("popmq") with no register call: PySpark finds the pyspark_popmq module by itself.

The job runs in its own interpreter against popmq installed the way a user installs it (a real,
non-editable install into a directory on PYTHONPATH): setuptools' editable installs use an
import hook that PySpark's pkgutil module scan cannot see.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import spark_environment

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("autoregister_job.py")
# What a wheel is built from (a clean copy: the checkout's build/ may hold stale modules).
SOURCES = ["setup.py", "pyproject.toml", "README.md", "popmq", "broker", "proxy", "pyspark_popmq"]


@pytest.fixture(scope="module")
def installed_popmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    source, target = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("site")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=skip)
        else:
            shutil.copy2(REPO / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    assert (target / "pyspark_popmq" / "__init__.py").is_file()
    yield target


def _run_job(endpoint: str, topic: str, work: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, **spark_environment(), "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, str(JOB), endpoint, topic, str(work)],
        capture_output=True, text=True, timeout=300, env=env, cwd=work,
    )  # fmt: skip


def test_a_fresh_session_finds_format_popmq_for_batch_and_streaming_reads_and_writes(
    installed_popmq: Path, endpoint: str, topic: str, tmp_path: Path
) -> None:
    done = _run_job(endpoint, topic, tmp_path, installed_popmq)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    written = ["batch-0", "batch-1", "batch-2", "stream-0", "stream-1"]
    assert seen == {"batch": written, "stream": written}
