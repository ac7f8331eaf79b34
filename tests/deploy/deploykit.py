"""Shared helpers for the deployment tests (a plain module, not a conftest, so its name cannot
clash with other test packages): the Helm chart rendered by Helm's own engine
(helm-python-sdk binds Helm's Go library), the real CLI parser, and manifest lookups."""

from __future__ import annotations

import argparse
import base64
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "popmq"
EXAMPLES_DIR = REPO / "deploy" / "k8s"
RELEASE = "popmq"
NAMESPACE = "mq"

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (the `test` extra) is missing")

try:
    import kubernetes_validate.utils as _kubernetes_validate
except ImportError:  # the tests that validate manifests skip without it
    pass
else:
    # kubernetes_validate reads and parses its schema files on every validate() (the definitions
    # alone are 1 MB of JSON); they never change, so each is parsed once per test process. The
    # validation itself is the library's, unchanged.
    _kubernetes_validate.schema_contents = functools.cache(_kubernetes_validate.schema_contents)

Manifest = dict[str, Any]


class Rendered:
    """One rendering of the chart: manifests by kind and name, plus NOTES.txt."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files
        self.notes = next((text for path, text in files.items() if path.endswith("NOTES.txt")), "")
        self.manifests: list[Manifest] = [
            doc
            for path, text in sorted(files.items())
            if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text)
            if doc
        ]

    def kinds(self) -> list[str]:
        return sorted(m["kind"] for m in self.manifests)

    def all(self, kind: str) -> list[Manifest]:
        return [m for m in self.manifests if m["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> Manifest:
        found = [m for m in self.all(kind) if name is None or m["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
        return found[0]

    def maybe(self, kind: str) -> Manifest | None:
        found = self.all(kind)
        return found[0] if found else None

    def config_text(self) -> str:
        # the popmq config (the Grafana dashboard, when on, is another ConfigMap)
        [config] = [c for c in self.all("ConfigMap") if "popmq.yaml" in c.get("data", {})]
        return config["data"]["popmq.yaml"]

    def secret_file(self, name: str, key: str) -> str:
        """A chart-made Secret's file, decoded."""
        secret = self.one("Secret", name)
        return base64.b64decode(secret["data"][key]).decode()


def render(values: dict[str, Any] | None = None) -> Rendered:
    with helm.Chart.load(str(CHART_DIR)) as chart:
        return Rendered(chart.render(values=values, name=RELEASE, namespace=NAMESPACE))


def load_values_file(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES_DIR / name).read_text())


def container(workload: Manifest) -> Manifest:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def pod_env(workload: Manifest, secret_value: str, pod_ip: str = "10.0.0.7") -> dict[str, str]:
    """The POPMQ_* environment a pod of this workload would see (secret refs and the downward
    API resolved to the given values)."""
    env: dict[str, str] = {}
    for item in container(workload).get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif "secretKeyRef" in item.get("valueFrom", {}):
            env[item["name"]] = secret_value
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[item["name"]] = pod_ip
    return {k: v for k, v in env.items() if k.startswith("POPMQ_")}


# --- the real CLI parser -------------------------------------------------------------------


@functools.cache
def cli_parser() -> argparse.ArgumentParser:
    """The real parser, built once (about 0.2 s a build): parsing leaves it unchanged."""
    from popmq.cli import build_parser

    return build_parser()


def cli_commands() -> set[str]:
    parser = cli_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


def parse_cli(argv: list[str]) -> argparse.Namespace:
    """Parse a popmq command line, skipping when its subcommand is not built yet."""
    known = {"serve", "proxy", "broker", "admin", "bench"}
    command = next((arg for arg in argv if arg in known), None)
    if command is not None and command not in cli_commands():
        pytest.skip(f"`popmq {command}` is not registered in popmq.cli yet")
    try:
        return cli_parser().parse_args(argv)
    except SystemExit as exc:  # argparse reports the bad flag on stderr
        raise AssertionError(f"popmq rejected the command line {argv}") from exc


def walk(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Leaves of nested dicts as (dotted.path, value)."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from walk(value, path + ".")
        else:
            yield path, value
