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


def test_license_metadata_is_an_spdx_expression(tmp_path: Path) -> None:
    """PEP 639: `license = "Apache-2.0"` (the TOML table form makes setuptools warn on every
    install and writes the old `License:` field instead)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("popmq-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text.splitlines()


def test_every_runtime_dependency_is_imported() -> None:
    """A dependency nothing imports is weight on every install (and a CVE feed to follow)."""
    import re
    import tomllib
    from importlib.metadata import packages_distributions

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower().replace("_", "-") for d in declared}
    modules_of: dict[str, set[str]] = {}
    for module, dists in packages_distributions().items():
        for dist in dists:
            modules_of.setdefault(dist.lower().replace("_", "-"), set()).add(module)
    sources = [p for folder in ("popmq", "broker", "proxy", "pyspark_popmq")
               for p in (REPO / folder).rglob("*.py") if "/pb/" not in str(p)]  # fmt: skip
    code = "\n".join(p.read_text() for p in sources)
    unused = []
    for name in sorted(names):
        modules = modules_of.get(name, set())
        # google.protobuf and friends share the `google` namespace: match the full import path
        pattern = "|".join(re.escape(m) for m in modules) or "$^"
        if name == "protobuf":
            pattern = r"google\.protobuf"
        elif name.startswith("grpcio-"):
            pattern = {"grpcio-health-checking": "grpc_health", "grpcio-reflection":
                       "grpc_reflection"}[name]  # fmt: skip
        elif name == "opentelemetry-api":
            pattern = r"opentelemetry(?!\.(sdk|exporter|instrumentation))"
        elif name.startswith("opentelemetry-"):  # opentelemetry-exporter-x: ...exporter.x
            pattern = re.escape(name.replace("-", "."))
        if not re.search(rf"^\s*(from|import) ({pattern})\b", code, re.M):
            unused.append(name)
    assert unused == []
