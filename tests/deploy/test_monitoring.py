"""The chart's monitoring: the broker PodMonitor, the PrometheusRule with the alerts of
docs/operations.md and the Grafana dashboard, rendered by Helm and checked against what popmq
really exports. (The CRDs are not in the Kubernetes schemas; their shape is checked here.)"""

from __future__ import annotations

import json
import re
from typing import Any

from deploykit import CHART_DIR, NAMESPACE, REPO, render

from popmq.config import PopmqConfig

DASHBOARD = json.loads((CHART_DIR / "dashboards" / "popmq.json").read_text())
ON = {
    "broker": {"metrics": {"podMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "monitoring": {
        "prometheusRule": {"enabled": True, "backlogMessages": 500, "lagLatencySeconds": 90},
        "grafanaDashboard": {"enabled": True},
    },
}
# Series that come from Prometheus itself, the kubelet or kube-state-metrics.
FOREIGN = {"up", "kubelet_volume_stats_available_bytes", "kubelet_volume_stats_capacity_bytes",
           "kube_pod_container_status_restarts_total"}  # fmt: skip
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_info")


def _exported() -> set[str]:
    """Metric names popmq defines (the sources that name them)."""
    names: set[str] = set()
    for path in ("broker/metrics.py", "proxy/metrics.py", "popmq/metrics_http.py",
                 "broker/leader_gate.py", "broker/replication/metrics.py"):  # fmt: skip
        names |= set(re.findall(r'"((?:popmq|rocketmq)_[a-z_]+)"', (REPO / path).read_text()))
    return names | {"process_resident_memory_bytes", "process_cpu_seconds_total"}


def _unknown_metrics(expr: str, exported: set[str]) -> list[str]:
    unknown = []
    for name in re.findall(r"\b([a-z_]+)(?=\{|\[|\)| )", expr):
        if not name.startswith(("popmq_", "rocketmq_", "process_", "kube", "up")):
            continue
        if name in FOREIGN or name in exported:
            continue
        if any(name.endswith(s) and name[: -len(s)] in exported for s in SUFFIXES):
            continue
        unknown.append(name)
    return unknown


def test_off_by_default() -> None:
    out = render()
    assert out.maybe("PodMonitor") is None and out.maybe("PrometheusRule") is None
    assert not [c for c in out.all("ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]


def test_pod_monitor_selects_the_broker_pods_metrics_port() -> None:
    out = render(ON)
    monitor = out.one("PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    selector = monitor["spec"]["selector"]["matchLabels"]
    sts = out.one("StatefulSet")
    assert selector.items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    deploy = out.one("Deployment")
    assert not selector.items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    ports = {p["name"] for c in sts["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    # metrics off: no PodMonitor even when asked for
    off = render({**ON, "broker": {"metrics": {"enabled": False, "podMonitor": {"enabled": True}}}})
    assert off.maybe("PodMonitor") is None


def test_prometheus_rule_alerts_use_real_metrics_and_the_values() -> None:
    rule = render(ON).one("PrometheusRule")
    exported = _exported()
    alerts: dict[str, dict[str, Any]] = {}
    for group in rule["spec"]["groups"]:
        for entry in group["rules"]:
            alerts[entry["alert"]] = entry
            assert entry["labels"]["severity"] in {"critical", "warning", "info"}
            assert entry["annotations"]["summary"]
            assert _unknown_metrics(entry["expr"], exported) == [], entry["alert"]
            assert entry["expr"].count("(") == entry["expr"].count(")"), entry["alert"]
            assert "{{" not in entry["expr"], "an unrendered template in the expression"
    assert len(alerts) >= 15
    assert alerts["PopmqConsumerLag"]["expr"].endswith("> 500")
    assert alerts["PopmqConsumerLagLatency"]["expr"].endswith("> 90000")
    assert 'namespace="mq"' in alerts["PopmqDlqGrowing"]["expr"]
    assert "popmq_proxy_broker_up" in alerts["PopmqBrokerUnreachable"]["expr"]
    # Prometheus' own templating survives Helm's
    assert "{{ $labels.consumer_group }}" in alerts["PopmqDlqGrowing"]["annotations"]["summary"]
    # every alert the docs name is in the rule
    doc = (REPO / "docs" / "operations.md").read_text()
    assert sorted(set(re.findall(r"`(Popmq[A-Za-z]+)`", doc))) == sorted(alerts)


def test_dashboard_config_map_and_queries() -> None:
    out = render(ON)
    [config_map] = [c for c in out.all("ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["popmq.json"]) == DASHBOARD
    exported = _exported()
    titles = [p["title"] for p in DASHBOARD["panels"]]
    for wanted in ("Messages in", "lag", "In flight", "Dead-letter", "Long polls by strategy",
                   "false-empty", "Broker RPCs", "latency"):  # fmt: skip
        assert any(wanted in t for t in titles), wanted
    for panel in DASHBOARD["panels"]:
        assert panel["targets"]
        for target in panel["targets"]:
            assert _unknown_metrics(target["expr"], exported) == [], panel["title"]


def test_dashboard_file_is_generated() -> None:
    """helm/popmq/dashboards/popmq.json is what scripts/gen_dashboard.py writes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gen_dashboard", REPO / "scripts" / "gen_dashboard.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.dashboard() == DASHBOARD


def test_cluster_label_is_configurable() -> None:
    assert PopmqConfig().broker.cluster == PopmqConfig().proxy.cluster == "DefaultCluster"


def _script(name: str):  # type: ignore[no-untyped-def]
    import importlib.util
    import sys

    sys.path.insert(0, str(REPO / "scripts"))  # render_dashboard_png imports gen_dashboard
    try:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return module


def test_dashboard_png_plots_every_panel_query() -> None:
    """docs/img/dashboard.png is drawn from the dashboard's own targets: the renderer evaluates
    each one (two scrapes of every series a query names); none is skipped or unreadable."""
    render_png = _script("render_dashboard_png")
    gen = _script("gen_dashboard")

    def scrape(scale: float) -> dict:
        out = {}
        for panel in gen.PANELS:
            for expr, _ in panel[2]:
                for name in re.findall(r"\b((?:rocketmq|popmq|process)_[a-z_]+)", expr):
                    labels = {"topic": "t", "consumer_group": "g", "strategy": "adaptive",
                              "kind": "pop", "code": "OK", "broker": "b", "group": "g",
                              "request_code": "SendMessage", "result": "found",
                              "message_type": "normal", "node_id": "b", "pod": "p"}  # fmt: skip
                    les = ["1", "10", "+Inf"] if name.endswith("_bucket") else [None]
                    for n, le in enumerate(les):
                        with_le = {**labels, "le": le} if le else labels
                        out[(name, frozenset(with_le.items()))] = scale * (n + 1)
        return out

    samples = [(0.0, scrape(1.0)), (3.0, scrape(4.0))]
    for title, _, targets in gen.PANELS:
        for expr, legend in targets:
            series = render_png.evaluate(expr, legend, samples)
            assert series and all(points for points in series.values()), (title, expr)
    # the shapes: a rate over the interval, an instant sum, a quantile inside its bucket
    rate = render_png.evaluate("sum by (topic) (rate(rocketmq_messages_in_total[1m]))",
                               "{{topic}}", samples)  # fmt: skip
    assert rate == {"t": [(3.0, 1.0)]}
    quantile = render_png.evaluate(
        "histogram_quantile(0.5, sum by (le) (rate(rocketmq_rpc_latency_bucket[5m])))",
        "p50",
        samples,
    )
    assert quantile["p50"][0][1] == 1 + (10 - 1) * 0.5  # rank 1.5 of 3, inside (1, 10]
    # The empties of the long-poll panel are among what the picture shows.
    assert any("empty" in legend for *_, targets in gen.PANELS for _, legend in targets)
