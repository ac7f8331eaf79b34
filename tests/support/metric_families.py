"""Every metric family a registry would expose, as (name, type, label names, help): what
dashboards and alerts depend on, compared by the metric-table tests with a frozen list."""

from __future__ import annotations

from prometheus_client import CollectorRegistry


def families(registry: CollectorRegistry) -> list[tuple[str, str, tuple[str, ...], str]]:
    rows = []
    for collector in registry._collector_to_names:
        labels = tuple(getattr(collector, "_labelnames", ()))
        found = collector.describe() if hasattr(collector, "describe") else collector.collect()
        rows += [(fam.name, fam.type, labels, fam.documentation) for fam in found]
    return sorted(rows)
