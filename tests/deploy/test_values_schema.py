"""values.schema.json: bad values fail at install time with a clear message, and the `config`
part of the schema and of values.yaml stays in step with popmq/config.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from deploykit import CHART_DIR, helm, render, walk

from popmq.config import PopmqConfig

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART_DIR / "values.yaml").read_text())

# (values, words the error must contain: the offending path and what is wrong)
BAD_VALUES: list[tuple[dict[str, Any], list[str]]] = [
    ({"broker": {"replicas": 0}}, ["/broker/replicas", "minimum"]),
    ({"broker": {"replicas": "3"}}, ["/broker/replicas", "integer"]),
    ({"broker": {"persistence": {"size": "ten gigs"}}}, ["/broker/persistence/size"]),
    ({"broker": {"port": 70000}}, ["/broker/port", "maximum"]),
    ({"proxy": {"service": {"type": "Ingress"}}}, ["/proxy/service/type"]),
    ({"proxy": {"replicas": -1}}, ["/proxy/replicas"]),
    ({"proxy": {"autoscaling": {"targetCPUUtilizationPercentage": 150}}}, ["targetCPU"]),
    ({"proxy": {"advertise": {"host": "not a host"}}}, ["/proxy/advertise/host"]),
    ({"clusterToken": {"value": "short"}}, ["/clusterToken/value"]),
    ({"clusterToken": {"value": "12345678901234567890"}}, ["/clusterToken/value"]),
    ({"handleSecret": {"value": "kNoLongerAValue0123"}}, ["handleSecret"]),
    ({"auth": {"enabled": "yes"}}, ["/auth/enabled"]),
    ({"tls": {"enabled": True, "brokers": {"enabled": False, "mutal": True}}}, ["mutal"]),
    ({"proxy": {"adminPort": 70000}}, ["/proxy/adminPort"]),
    ({"config": {"broker": {"store": {"flush": "never"}}}}, ["/config/broker/store/flush"]),
    ({"config": {"broker": {"pop": {"max_attempts": 0}}}}, ["/config/broker/pop/max_attempts"]),
    ({"config": {"broker": {"pop": {"retry_levels": ["5 minutes"]}}}}, ["retry_levels"]),
    ({"config": {"broker": {"pop": {"retry_levels": []}}}}, ["retry_levels", "minItems"]),
    ({"config": {"broker": {"topics": {"queue_count": 5000}}}}, ["queue_count", "maximum"]),
    ({"config": {"proxy": {"strategy": "fastest"}}}, ["/config/proxy/strategy", "adaptive"]),
    ({"config": {"proxy": {"min_long_polling_ms": -1}}}, ["min_long_polling_ms"]),
    ({"config": {"proxy": {"notify_hysteresis": 1}}}, ["notify_hysteresis"]),
    ({"config": {"proxy": {"min_long_polling_ms": "5s"}}}, ["min_long_polling_ms", "integer"]),
    # Set by the chart itself; accepting them here would silently lose them.
    ({"config": {"proxy": {"port": 9000}}}, ["/config/proxy", "port"]),
    ({"config": {"broker": {"handle_secret": "x" * 20}}}, ["/config/broker", "handle_secret"]),
    ({"config": {"serve": {"brokers": 2}}}, ["/config", "serve"]),
    ({"brokers": 3}, ["brokers"]),
    ({"brokerGroups": [{"name": "Group_A"}]}, ["/brokerGroups/0/name"]),
    ({"brokerGroups": [{"name": "a", "replication": "off"}]}, ["/brokerGroups/0/replication"]),
    ({"etcd": {"enabled": True, "replicas": 2}}, ["/etcd/replicas"]),
    ({"broker": {"antiAffinity": "always"}}, ["/broker/antiAffinity"]),
]

# Rules across values that JSON schema cannot state; the templates fail with these words.
BAD_COMBINATIONS: list[tuple[dict[str, Any], str]] = [
    # GitOps (helm template, Argo CD): lookup cannot read generated secrets back, so each render
    # made a new cluster token and admin key. generateSecrets=false makes that an error.
    ({"generateSecrets": False}, "clusterToken: generateSecrets is false, so name the token"),
    (
        {"generateSecrets": False, "clusterToken": {"existingSecret": "my-token"}},
        "auth: generateSecrets is false, so name the ACL: auth.existingSecret",
    ),
    (
        {"config": {"proxy": {"min_long_polling_ms": 30000}}},
        "min_long_polling_ms (30000) must not exceed config.proxy.max_long_polling_ms (20000)",
    ),
    (
        {"config": {"proxy": {"min_invisible_ms": 100, "max_invisible_ms": 50}}},
        "config.proxy.min_invisible_ms (100) must not exceed",
    ),
    (
        {"config": {"broker": {"pop": {"min_invisible_ms": 100, "max_invisible_ms": 50}}}},
        "config.broker.pop.min_invisible_ms (100) must not exceed",
    ),
    (
        {"config": {"proxy": {"max_long_polling_ms": 60000}}},
        "proxy.terminationGracePeriodSeconds (45) must be longer",
    ),
    (
        {"proxy": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}},
        "minReplicas (5) must not exceed",
    ),
    ({"proxy": {"advertise": {"host": "a.b", "podIP": True}}}, "not both"),
    ({"proxy": {"metrics": {"port": 8081}}}, "are both 8081"),
    ({"tls": {"enabled": True, "brokers": {"enabled": False}}}, "tls.enabled needs tls.secretName"),
    (
        {"tls": {"enabled": False, "clientAuth": True, "brokers": {"enabled": False}}},
        "tls.clientAuth needs tls.enabled",
    ),
    ({"tls": {"enabled": False, "brokers": {"enabled": True}}}, "tls.brokers.secretName"),
    ({"proxy": {"adminPort": 9090}}, "proxy.adminPort (9090) must differ"),
    ({"etcd": {"enabled": True, "endpoints": ["http://e:2379"]}}, "etcd.enabled (the chart"),
    ({"brokerGroups": [{"name": "a"}]}, "brokerGroups needs etcd"),
    (
        {"etcd": {"enabled": True}, "brokerGroups": [{"name": "a", "replicas": 2, "minInSync": 3}]},
        "brokerGroups a: minInSync (3) must not exceed replicas (2)",
    ),
]

# Model fields the chart sets from other values (addresses, names, secret) or keeps from users
# (test-only knobs, the single-process `serve` section).
CHART_OWNED = {
    "broker.name", "broker.host", "broker.port", "broker.data_dir", "broker.metrics_port",
    "broker.pop.time_scale",
    # identity and access: files of mounted Secrets, set from auth/clusterToken/tls values
    "broker.handle_keys_file", "broker.tls", "broker.cluster_token_file",
    "proxy.acl", "proxy.tls", "proxy.admin_port", "proxy.broker_link",
    "proxy.host", "proxy.port", "proxy.advertise_host", "proxy.advertise_port",
    "proxy.metrics_port", "proxy.brokers",
    "proxy.reuse_port",  # set by `popmq proxy --workers N` on its workers, never by hand
    "serve",
    # replicated groups: set per group from brokerGroups (replication, minInSync) as flags
    "broker.replication",
    # the console's pods: --trusted-proxy from console.trustedProxies
    "console.trusted_proxies",
}  # fmt: skip


@pytest.mark.parametrize(("values", "words"), BAD_VALUES, ids=lambda v: json.dumps(v)[:60])
def test_schema_rejects_bad_values(values: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(values)
    message = str(caught.value)
    for word in words:
        assert word in message, f"{word!r} not in: {message}"


@pytest.mark.parametrize(("values", "words"), BAD_COMBINATIONS, ids=lambda v: json.dumps(v)[:60])
def test_templates_reject_bad_combinations(values: dict[str, Any], words: str) -> None:
    with pytest.raises(helm.HelmError) as caught:
        render(values)
    assert words in str(caught.value)


def test_schema_accepts_edge_values() -> None:
    render(
        {
            "broker": {"persistence": {"storageClass": "-", "size": "500Mi"}, "replicas": 64},
            "proxy": {
                "pdb": {"maxUnavailable": "25%"},
                "advertise": {"host": "10.1.2.3"},
                "adminPort": None,
            },
            "config": {"broker": {"pop": {"retry_levels": ["500ms", "1.5s", "2h", "1d"]}}},
            "clusterToken": {"value": "kA1_b2+c3/d4=e5.f"},
            "auth": {"enabled": False},
        }
    )


def _model_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    schema = PopmqConfig.model_json_schema()
    return schema, schema.get("$defs", {})


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Follow $ref (pydantic's #/$defs/X or the chart's #/definitions/X), keeping siblings."""
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        node = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {
            **_resolve(node["allOf"][0], defs),
            **{k: v for k, v in node.items() if k != "allOf"},
        }
    return node


def _leaves(node: dict[str, Any], defs: dict[str, Any], prefix: str = "") -> dict[str, dict]:
    node = _resolve(node, defs)
    out: dict[str, dict] = {}
    for key, child in node.get("properties", {}).items():
        child = _resolve(child, defs)
        path = f"{prefix}{key}"
        if child.get("type") == "object" and "properties" in child:
            out.update(_leaves(child, defs, path + "."))
        else:
            out[path] = child
    return out


def _owned(path: str) -> bool:
    return any(path == owned or path.startswith(owned + ".") for owned in CHART_OWNED)


def test_schema_config_matches_the_config_model() -> None:
    model, model_defs = _model_schema()
    model_leaves = _leaves(model, model_defs)
    chart_leaves = _leaves(SCHEMA["properties"]["config"], SCHEMA["definitions"])

    unknown = sorted(set(chart_leaves) - set(model_leaves))
    assert not unknown, f"values.schema.json accepts config keys the model rejects: {unknown}"
    missing = sorted(p for p in set(model_leaves) - set(chart_leaves) if not _owned(p))
    assert not missing, (
        f"config fields with no place in the chart: {missing}; add them to values.yaml and "
        "values.schema.json (config section), or to CHART_OWNED here"
    )
    for path, chart in chart_leaves.items():
        field = model_leaves[path]
        for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            assert chart.get(bound) == field.get(bound), f"{path}: {bound} differs"
        if "enum" in field or "const" in field:
            assert sorted(chart["enum"]) == sorted(field.get("enum", [field.get("const")])), path
        elif field.get("type") in {"integer", "boolean", "array"}:
            assert chart.get("type") == field["type"], path
        elif field.get("type") == "number":
            assert chart.get("type") == "number", path


def test_values_yaml_config_lists_every_knob_with_the_model_default() -> None:
    chart_leaves = _leaves(SCHEMA["properties"]["config"], SCHEMA["definitions"])
    defaults = PopmqConfig().model_dump(mode="json")
    listed = dict(walk(VALUES["config"]))
    assert sorted(listed) == sorted(chart_leaves), "values.yaml config and schema differ"
    for path, value in listed.items():
        expected: Any = defaults
        for part in path.split("."):
            expected = expected[part]
        assert value == expected, (
            f"config.{path}: values.yaml {value!r}, model default {expected!r}"
        )


def test_default_values_pass_the_schema() -> None:
    with helm.Chart.load(str(CHART_DIR)) as chart:
        chart.validate_schema(VALUES)


def test_gitops_values_render_without_generating_secrets() -> None:
    """With generateSecrets=false and Secrets named, two renders are identical (an offline
    render must not differ from the last one) and the chart makes no Secret of its own."""
    values = {
        "generateSecrets": False,
        "clusterToken": {"existingSecret": "my-token"},
        "auth": {"enabled": True, "existingSecret": "my-users"},
    }
    first, second = render(values), render(values)
    assert first.files == second.files
    assert first.maybe("Secret") is None
