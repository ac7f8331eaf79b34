"""What `pip install .` ships: the one `popmq` namespace, with broker/ and proxy/ inside it.

The repository keeps broker/ and proxy/ as top-level folders (the design card's layout);
setup.py maps them to popmq.broker and popmq.proxy. A top-level `broker` or `proxy` module in
site-packages would collide with other distributions (PyPI's proxy.py ships `proxy`).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess  # starts popmq or another process

REPO = Path(__file__).resolve().parent.parent
ALLOWED_TOP_LEVEL = {"popmq", "pyspark_popmq"}


def test_the_wheel_installs_only_the_popmq_namespace(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("popmq-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level <= ALLOWED_TOP_LEVEL, f"unexpected top-level names: {top_level}"
    shipped = ["popmq/broker/core.py", "popmq/broker/store/commitlog.py", "popmq/proxy/server.py",
               "popmq/proxy/longpoll/notify.py", "popmq/spark/__init__.py",
               "popmq/console/templates/base.html", "popmq/console/static/console.js",
               "popmq/console/static/console.css"]  # fmt: skip
    for module in shipped:
        assert module in names, module
    assert not any(name.startswith("popmq/") and "/tests/" in name for name in names)
