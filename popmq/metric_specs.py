"""Metrics declared as data: a MetricSpec is what a dashboard reads (kind, name, help, labels,
buckets). The proxy's and the broker's tables (proxy/metrics.py PROXY_METRICS, broker/metrics.py
BROKER_METRICS) are lists of them, built into a registry at start-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

Kind = type[Counter] | type[Gauge] | type[Histogram]


@dataclass(frozen=True)
class MetricSpec:
    """One metric's definition. ``exported`` lists label values (one tuple per series) whose
    series exist, at 0, from the start (so rate() sees the first event)."""

    kind: Kind
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    exported: tuple[tuple[str, ...], ...] = ()

    def build(self, registry: CollectorRegistry) -> Any:
        if self.buckets is None:
            metric = self.kind(self.name, self.help, self.labels, registry=registry)
        else:
            metric = Histogram(
                self.name, self.help, self.labels, registry=registry, buckets=self.buckets
            )
        for values in self.exported:
            metric.labels(*values)
        return metric


def spec(kind: Kind, name: str, help: str, *labels: str, buckets: tuple[float, ...] | None = None,
         exported: tuple[tuple[str, ...], ...] = ()) -> MetricSpec:  # fmt: skip
    """A MetricSpec with its labels given as arguments (the tables read as one line each)."""
    return MetricSpec(kind, name, help, labels, buckets, exported)


def build_all(specs: tuple[MetricSpec, ...], registry: CollectorRegistry) -> dict[str, Any]:
    """Each spec's metric, by name, registered in ``registry`` in the table's order."""
    names = [each.name for each in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"a metric declared twice in {names}")
    return {each.name: each.build(registry) for each in specs}
