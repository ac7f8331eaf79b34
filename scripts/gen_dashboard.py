"""Write helm/popmq/dashboards/popmq.json, the Grafana dashboard the chart ships.

The panels are listed here, so the JSON stays reviewable and tests can check every query
against the metrics popmq exports. Usage: python scripts/gen_dashboard.py
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "helm" / "popmq" / "dashboards" / "popmq.json"
NS = 'namespace=~"$namespace"'

# (title, unit, [(PromQL, legend)])
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "Messages in (produced) by topic",
        "msg/s",
        [
            (f"sum by (topic) (rate(rocketmq_messages_in_total{{{NS}}}[1m]))", "{{topic}}"),
        ],
    ),
    (
        "Messages in by message type",
        "msg/s",
        [
            (
                f"sum by (message_type) (rate(rocketmq_messages_in_total{{{NS}}}[1m]))",
                "{{message_type}}",
            ),
        ],
    ),
    (
        "Throughput in and out (message bodies)",
        "Bps",
        [
            (f"sum by (topic) (rate(rocketmq_throughput_in_total{{{NS}}}[1m]))", "in {{topic}}"),
            (
                f"sum by (consumer_group) (rate(rocketmq_throughput_out_total{{{NS}}}[1m]))",
                "out {{consumer_group}}",
            ),
        ],
    ),
    (
        "Message size p99 by topic",
        "bytes",
        [
            (
                "histogram_quantile(0.99, sum by (le, topic) "
                f"(rate(rocketmq_message_size_bucket{{{NS}}}[5m])))",
                "{{topic}}",
            ),
        ],
    ),
    (
        "Messages out (delivered) by group",
        "msg/s",
        [
            (
                f"sum by (consumer_group) (rate(rocketmq_messages_out_total{{{NS}}}[1m]))",
                "{{consumer_group}}",
            ),
        ],
    ),
    (
        "Consumer lag (messages not acked)",
        "short",
        [
            (
                f"sum by (consumer_group, topic) (rocketmq_consumer_lag_messages{{{NS}}})",
                "{{consumer_group}} / {{topic}}",
            ),
        ],
    ),
    (
        "Consumer lag latency (oldest message not acked)",
        "ms",
        [
            (
                f"max by (consumer_group, topic) (rocketmq_consumer_lag_latency{{{NS}}})",
                "{{consumer_group}} / {{topic}}",
            ),
        ],
    ),
    (
        "Ready (visible, not delivered yet)",
        "short",
        [
            (
                f"sum by (consumer_group, topic) (rocketmq_consumer_ready_messages{{{NS}}})",
                "{{consumer_group}} / {{topic}}",
            ),
        ],
    ),
    (
        "Queueing latency (oldest ready message)",
        "ms",
        [
            (
                f"max by (consumer_group, topic) (rocketmq_consumer_queueing_latency{{{NS}}})",
                "{{consumer_group}} / {{topic}}",
            ),
        ],
    ),
    (
        "In flight (popped, not acked)",
        "short",
        [
            (
                f"sum by (consumer_group, topic) (rocketmq_consumer_inflight_messages{{{NS}}})",
                "{{consumer_group}} / {{topic}}",
            ),
        ],
    ),
    (
        "Dead-letter queues",
        "short",
        [
            (
                "sum by (consumer_group, topic) "
                f"(increase(rocketmq_send_to_dlq_messages_total{{{NS}}}[5m]))",
                "sent {{consumer_group}} / {{topic}} (5m)",
            ),
            (f"sum by (group) (popmq_broker_dlq_stored_messages{{{NS}}})", "kept {{group}}"),
        ],
    ),
    (
        "Long polls by strategy",
        "req/s",
        [
            (f"sum by (strategy) (rate(popmq_proxy_long_polls_total{{{NS}}}[1m]))", "{{strategy}}"),
            (
                f"sum by (strategy) (rate(popmq_proxy_first_pop_hits_total{{{NS}}}[1m]))",
                "first pop hit {{strategy}}",
            ),
            (f"sum(rate(popmq_proxy_pop_with_notify_total{{{NS}}}[1m]))", "went to notify"),
        ],
    ),
    (
        "Empty and false-empty answers",
        "req/s",
        [
            (
                f"sum by (strategy) (rate(popmq_proxy_empty_responses_total{{{NS}}}[5m]))",
                "empty {{strategy}}",
            ),
            (
                f"sum by (strategy) (rate(popmq_proxy_false_empty_responses_total{{{NS}}}[5m]))",
                "false empty {{strategy}}",
            ),
        ],
    ),
    (
        "Broker RPCs from proxies",
        "req/s",
        [
            (f"sum by (kind) (rate(popmq_proxy_broker_rpcs_total{{{NS}}}[1m]))", "{{kind}}"),
            (
                f"sum by (kind, code) (rate(popmq_proxy_broker_rpc_errors_total{{{NS}}}[5m]))",
                "error {{kind}} {{code}}",
            ),
        ],
    ),
    (
        "Brokers reachable from each proxy",
        "short",
        [
            (f"min by (broker) (popmq_proxy_broker_up{{{NS}}})", "{{broker}}"),
        ],
    ),
    (
        "RPC latency p99 (without receive)",
        "ms",
        [
            (
                "histogram_quantile(0.99, sum by (le, request_code) "
                "(rate(rocketmq_rpc_latency_bucket"
                f'{{{NS}, request_code!="ReceiveMessage"}}[5m])))',
                "{{request_code}}",
            ),
        ],
    ),
    (
        "Receive: time held until answered (p50, p99)",
        "s",
        [
            (
                "histogram_quantile(0.5, sum by (le, result) (rate("
                f"popmq_proxy_receive_duration_seconds_bucket{{{NS}}}[5m])))",
                "p50 {{result}}",
            ),
            (
                "histogram_quantile(0.99, sum by (le, result) (rate("
                f"popmq_proxy_receive_duration_seconds_bucket{{{NS}}}[5m])))",
                "p99 {{result}}",
            ),
        ],
    ),
    (
        "Storage (commitlog) per broker",
        "bytes",
        [
            (f"sum by (node_id) (rocketmq_storage_size{{{NS}}})", "{{node_id}}"),
        ],
    ),
    (
        "Process memory and CPU",
        "bytes",
        [
            (f"sum by (pod) (process_resident_memory_bytes{{{NS}}})", "RSS {{pod}}"),
        ],
    ),
]


def dashboard() -> dict:
    panels = []
    for index, (title, unit, queries) in enumerate(PANELS):
        panels.append({
            "id": index + 1,
            "type": "timeseries",
            "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
            "targets": [
                {"refId": chr(ord("A") + n), "expr": expr, "legendFormat": legend,
                 "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                for n, (expr, legend) in enumerate(queries)
            ],
        })  # fmt: skip
    return {
        "uid": "popmq-overview",
        "title": "popmq",
        "tags": ["popmq", "rocketmq"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                },
                {
                    "name": "namespace",
                    "type": "query",
                    "label": "namespace",
                    "includeAll": True,
                    "multi": True,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(popmq_build_info, namespace)",
                    "refresh": 2,
                    "allValue": ".*",
                },
            ]
        },
        "panels": panels,
    }


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
