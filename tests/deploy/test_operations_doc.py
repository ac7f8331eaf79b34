"""docs/operations.md stays true to the code: the metrics, labels and status codes it names
exist, its popmq commands parse, and the files and settings it points at are real."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from deploykit import CHART_DIR, REPO, parse_cli
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import Message, PopRequest
from popmq.broker.leader_gate import GroupCollector
from popmq.broker.replication.metrics import NodeCollector
from popmq.broker.replication.node import Promotion
from popmq.broker.replication.role import GroupRole
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.proxy.metrics import ProxyMetrics
from pydantic import BaseModel

from popmq.config import PopmqConfig

DOC = (REPO / "docs" / "operations.md").read_text()
# Placeholders in the doc's command lines, and a value the parser accepts for each.
PLACEHOLDERS = {"NAME": "broker-a", "HOST:PORT": "127.0.0.1:10911", "DIR": "/tmp/d",
                "FILE": "popmq.yaml", "TOPIC": "orders", "GROUP": "billing", "N": "3"}  # fmt: skip


def _families() -> dict[str, Any]:
    return {family.name: family for family in ProxyMetrics().registry.collect()}


def _labels() -> dict[str, set[str]]:
    metrics = ProxyMetrics()
    return {
        collector._name: set(collector._labelnames)  # prometheus_client keeps them here
        for collector in [*vars(metrics).values(), *metrics.instruments.values()]
        if hasattr(collector, "_labelnames")
    }


def _base(name: str, families: dict[str, Any]) -> str | None:
    for suffix in ("", "_total", "_bucket", "_sum", "_count"):
        if suffix and not name.endswith(suffix):
            continue
        base = name[: len(name) - len(suffix)] if suffix else name
        if base in families:
            return base
    return None


def test_every_metric_named_exists_with_its_labels_and_codes() -> None:
    families = _families()
    labels = _labels()
    named = set(re.findall(r"popmq_proxy_\w+", DOC))
    assert len(named) >= 10
    for name in named:
        assert _base(name, families), f"docs name {name}, which proxy/metrics.py does not define"
    for name, body in re.findall(r"(popmq_proxy_\w+)\{([^}]*)\}", DOC):
        allowed = labels[_base(name, families) or ""] | {"le"}
        used = re.findall(r"(\w+)\s*(?:=~|!=|!~|=)", body) or [
            part.strip() for part in body.split(",")
        ]
        assert set(used) <= allowed, f"{name}{{{body}}}: labels {set(used) - allowed} unknown"
        for code_value in re.findall(r'code=~?"([^"]+)"', body):
            for code in re.split(r"\\?\|", code_value):
                assert code in Code.__members__, f"no status code {code}"


async def _broker_families(data_dir: Path) -> dict[str, set[str]]:
    """Family name -> label names, from a real broker that has a group, a DLQ and traffic."""
    async with running_broker(fast_broker_config(data_dir)) as broker:
        await broker.send([Message("t", b"x"), Message("t", b"y")])
        popped = await broker.pop(PopRequest("g", "t", invisible_time_ms=60_000))
        await broker.forward_to_dlq("g", "t", popped.messages[0].receipt_handle)
        registry = broker.metrics.registry
        families = list(registry.collect())
    found = {
        family.name: {label for sample in family.samples for label in sample.labels}
        for family in families
    }
    found.update(_replication_families())
    # Labelled series with no child yet (e.g. damage counters on a healthy store) have no
    # samples: take their label names from the metric's definition.
    for collector in set(registry._names_to_collectors.values()):
        name, labels = getattr(collector, "_name", None), getattr(collector, "_labelnames", ())
        if name:
            found.setdefault(name, set()).update(labels)
    return found


async def test_every_broker_metric_named_exists_with_its_labels(tmp_path: Path) -> None:
    families = await _broker_families(tmp_path)
    named = set(re.findall(r"popmq_broker_\w+", DOC))
    assert len(named) >= 15
    for name in named:
        assert _base(name, families), f"docs name {name}, which broker/metrics.py does not define"
    for name, body in re.findall(r"(popmq_broker_\w+)\{([^}]*)\}", DOC):
        used = set(re.findall(r"(\w+)\s*(?:=~|!=|!~|=)", body))
        assert used <= families[_base(name, families) or ""], f"{name}{{{body}}}: bad labels"
    # The table's label column names real labels too.
    for name, labels in re.findall(r"^\| `(popmq_broker_\w+)`[^|]*\| ([^|]*) \|", DOC, re.M):
        for label in re.findall(r"`(\w+)`", labels):
            assert label in families[_base(name, families) or ""], f"{name}: no label {label}"


def _replication_families() -> dict[str, set[str]]:
    """The popmq_ha_* families, as a static leader with one follower and an elected node
    export them (they exist only on a node of a group, never on the plain broker above)."""
    follower = SimpleNamespace(name="a1", lag_bytes=0, lag_s=0.0)
    leader = SimpleNamespace(in_sync=SimpleNamespace(size=2), status=lambda: [follower])
    role = GroupRole(epoch=1, leader_name="a0", leader_address="127.0.0.1:1", is_leader=True)
    collector = NodeCollector("broker-a", lambda: "a0", lambda: role, lambda: None,
                              lambda: leader,  # type: ignore[arg-type,return-value]
                              promotion=lambda: Promotion(0.1, 0, 0))  # fmt: skip
    member = SimpleNamespace(
        settings=SimpleNamespace(group="broker-a", name="a0"), in_sync=["a0", "a1"],
        role=SimpleNamespace(epoch=1, is_leader=True, has_leader=True), elections_won=1,
        fenced=False, empty_copy_declines=0, leadership_given_up=0,
    )  # fmt: skip
    elected = GroupCollector(member)  # type: ignore[arg-type]
    return {
        family.name: {label for sample in family.samples for label in sample.labels}
        for family in [*collector.collect(), *elected.collect()]
    }


def test_every_group_metric_named_exists_with_its_labels() -> None:
    """docs/operations.md's popmq_ha_* names and their label column are what nodes export."""
    families = _replication_families()
    named = set(re.findall(r"popmq_ha_\w+", DOC))
    assert len(named) >= 7
    for name in named:
        assert _base(name, families), f"docs name {name}, which no group collector exports"
    for name, labels in re.findall(r"^\| `(popmq_ha_\w+)`[^|]*\| ([^|]*) \|", DOC, re.M):
        for label in re.findall(r"`(\w+)`", labels):
            assert label in families[_base(name, families) or ""], f"{name}: no label {label}"


def _commands() -> list[str]:
    text = re.sub(r"\\\n\s*", " ", DOC)  # a command continued on the next line is one command
    spans = re.findall(r"`(popmq [^`]+)`", text) + re.findall(r"^(popmq .+)$", text, re.M)
    return sorted({" ".join(span.split()) for span in spans})


@pytest.mark.parametrize("command", _commands())
def test_commands_in_the_doc_parse(command: str) -> None:
    argv = [PLACEHOLDERS.get(token, token) for token in command.split()[1:] if token != "..."]
    argv = [re.sub(r"=HOST:PORT$", "=127.0.0.1:10911", token) for token in argv]
    parse_cli(argv)


def test_files_the_doc_points_at_exist() -> None:
    paths = set(re.findall(r"`((?:helm|deploy|docs|popmq|proxy|broker)/[\w./-]*)`", DOC))
    paths |= {f"docs/{link}" for link in re.findall(r"\]\(([\w.-]+\.md)", DOC)}
    assert "helm/popmq" in paths
    for path in paths:
        assert (REPO / path).exists(), f"docs/operations.md names {path}, which does not exist"


def _has_path(tree: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if isinstance(tree, dict) and part in tree:
            tree = tree[part]
        elif isinstance(tree, BaseModel) and part in type(tree).model_fields:
            tree = getattr(tree, part)
        else:
            return False
    return True


def test_settings_the_doc_names_exist() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    model = PopmqConfig()
    named = set(re.findall(r"`((?:broker|proxy|auth|clusterToken|tls)\.[\w.]+)(?::[^`]*)?`", DOC))
    assert len(named) >= 10
    for dotted in named:
        # a config field (broker.pop.max_attempts) or a chart value (proxy.replicas)
        assert _has_path(model, dotted) or _has_path(values, dotted), f"no setting {dotted}"
