"""The console in the chart (console.enabled, off by default): a Deployment and a Service
talking to the proxies' admin API, admin keys from a Secret, its NetworkPolicy entries;
linted, schema-checked and validated as Kubernetes like the rest of the chart."""

from __future__ import annotations

from typing import Any

import pytest
from deploykit import CHART_DIR, NAMESPACE, container, helm, parse_cli, render

kubernetes_validate = pytest.importorskip("kubernetes_validate")

SECRET = {"existingSecret": "console-keys"}
ON: dict[str, Any] = {"console": {"enabled": True, "credentials": SECRET}}
WITH_POLICY: dict[str, Any] = {
    **ON,
    "proxy": {"adminPort": 8082},
    "tls": {"enabled": True, "secretName": "proxy-tls"},
    "networkPolicy": {
        "enabled": True,
        "clients": [{"namespaceSelector": {"matchLabels": {"team": "shop"}}}],
        "console": [{"namespaceSelector": {"matchLabels": {"name": "ingress"}}}],
    },
}


def _console(out: Any) -> Any:
    return out.one("Deployment", "popmq-console")


def test_off_by_default() -> None:
    out = render()
    assert [d["metadata"]["name"] for d in out.all("Deployment")] == ["popmq-proxy"]
    assert not [s for s in out.all("Service") if "console" in s["metadata"]["name"]]


@pytest.mark.parametrize("values", [ON, WITH_POLICY], ids=["on", "tls-and-policy"])
def test_lints_and_every_manifest_is_valid_kubernetes(values: dict[str, Any]) -> None:
    report = helm.lint(str(CHART_DIR), values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    for manifest in render(values).manifests:
        if manifest["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        kubernetes_validate.validate(manifest, kubernetes_validate.latest_version(), strict=True)


def test_console_talks_to_the_proxy_admin_api_with_keys_from_a_secret() -> None:
    out = render(WITH_POLICY)
    console = container(_console(out))
    args = parse_cli(console["args"])
    assert args.command == "console"
    assert (args.endpoint, args.host, args.port) == ("popmq-proxy-admin:8082", "0.0.0.0", 8080)
    assert args.tls_ca == "/var/run/popmq/tls/ca.crt"
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in console["env"]}
    assert env == {
        "POPMQ_ACCESS_KEY": {"name": "console-keys", "key": "accessKey"},
        "POPMQ_SECRET_KEY": {"name": "console-keys", "key": "secretKey"},
    }
    assert console["securityContext"]["readOnlyRootFilesystem"] is True
    service = out.one("Service", "popmq-console")
    pod_labels = _console(out)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    # The admin port has its own ClusterIP Service, never the (maybe public) client one.
    admin = out.one("Service", "popmq-proxy-admin")
    assert admin["spec"]["type"] == "ClusterIP"
    assert admin["spec"]["ports"] == [
        {"name": "admin", "port": 8082, "targetPort": "admin", "protocol": "TCP"}
    ]
    proxy_labels = out.one("Deployment", "popmq-proxy")["spec"]["template"]["metadata"]["labels"]
    assert admin["spec"]["selector"].items() <= proxy_labels.items()
    assert "admin" not in str(out.one("Service", "popmq-proxy")["spec"]["ports"])
    # Without an admin port, the admin API is on the client port (its Service).
    plain_out = render({**ON, "proxy": {"adminPort": None}})
    plain = parse_cli(container(_console(plain_out))["args"])
    assert plain.endpoint == "popmq-proxy:8081" and plain.tls_ca is None
    assert not [s for s in plain_out.all("Service") if s["metadata"]["name"].endswith("-admin")]
    assert plain.trusted_proxy is None  # X-Forwarded-For ignored unless proxies are listed
    behind = render({**ON, "console": {**ON["console"], "trustedProxies": ["10.1.0.0/16"]}})
    assert parse_cli(container(_console(behind))["args"]).trusted_proxy == ["10.1.0.0/16"]


def test_network_policy_lets_the_console_reach_the_proxies_and_its_users_reach_it() -> None:
    out = render(WITH_POLICY)
    policies = {p["metadata"]["name"]: p for p in out.all("NetworkPolicy")}
    console_labels = _console(out)["spec"]["template"]["metadata"]["labels"]
    proxy_rule = policies["popmq-proxy"]["spec"]["ingress"][0]
    assert {p["port"] for p in proxy_rule["ports"]} == {8081, 8082}
    selectors = [f["podSelector"]["matchLabels"] for f in proxy_rule["from"] if "podSelector" in f]
    assert any(s.items() <= console_labels.items() for s in selectors)
    console_policy = policies["popmq-console"]["spec"]
    assert console_policy["podSelector"]["matchLabels"].items() <= console_labels.items()
    assert console_policy["ingress"] == [{
        "ports": [{"port": 8080, "protocol": "TCP"}],
        "from": [{"namespaceSelector": {"matchLabels": {"name": "ingress"}}}],
    }]  # fmt: skip


def test_with_auth_a_credentials_secret_is_required() -> None:
    with pytest.raises(Exception, match=r"console\.credentials\.existingSecret"):
        render({"console": {"enabled": True}})
    # Without auth the proxies are open: no keys needed.
    out = render({"console": {"enabled": True}, "auth": {"enabled": False}})
    assert "env" not in container(_console(out))
