"""Chart values operators reach for first: image registry/tag/digest, update strategies,
per-component security contexts, extra volumes and sidecars (rendered by Helm's own engine and
checked against the Kubernetes schemas)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deploykit import render
from kubernetes_validate import validate

DIGEST = "sha256:" + "ab" * 32


def _pod(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def _validate_all(out: Any) -> None:
    for manifest in out.manifests:
        if manifest["apiVersion"].startswith("monitoring.coreos.com"):
            continue
        validate(manifest, "1.30", strict=True)


def test_image_registry_tag_and_digest() -> None:
    def images(values: dict[str, Any]) -> set[str]:
        out = render(values)
        return {c["image"] for w in (out.one("StatefulSet"), out.one("Deployment"))
                for c in _pod(w)["containers"]}  # fmt: skip

    assert images({"image": {"tag": "1.2.3"}}) == {"popmq:1.2.3"}
    assert images({"image": {"registry": "ghcr.io/acme", "tag": "1.2.3"}}) == {
        "ghcr.io/acme/popmq:1.2.3"
    }
    # a digest pins the image and wins over the tag
    assert images({"image": {"registry": "r.example:5000", "tag": "1.2.3", "digest": DIGEST}}) == {
        f"r.example:5000/popmq@{DIGEST}"
    }


def test_update_strategies() -> None:
    out = render()
    assert out.one("StatefulSet")["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    assert out.one("Deployment")["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }  # fmt: skip
    recreate = {"type": "Recreate", "rollingUpdate": None}  # null drops the default's key
    out = render({"broker": {"updateStrategy": {"type": "OnDelete"}},
                  "proxy": {"updateStrategy": recreate}})  # fmt: skip
    assert out.one("StatefulSet")["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert out.one("Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    _validate_all(out)


def test_component_security_contexts_merge_over_the_shared_ones() -> None:
    out = render({
        "broker": {"podSecurityContext": {"runAsUser": 20002, "supplementalGroups": [5]},
                   "securityContext": {"readOnlyRootFilesystem": False}},
        "proxy": {"securityContext": {"capabilities": {"drop": ["ALL"],
                                                       "add": ["NET_BIND_SERVICE"]}}},
    })  # fmt: skip
    broker, proxy = _pod(out.one("StatefulSet")), _pod(out.one("Deployment"))
    assert broker["securityContext"]["runAsUser"] == 20002
    assert broker["securityContext"]["supplementalGroups"] == [5]
    assert broker["securityContext"]["runAsNonRoot"] is True  # the shared one still applies
    assert proxy["securityContext"]["runAsUser"] == 10001  # not the broker's
    assert broker["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False
    assert broker["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    assert proxy["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert proxy["containers"][0]["securityContext"]["capabilities"]["add"] == ["NET_BIND_SERVICE"]
    _validate_all(out)
    # and the defaults are untouched by an empty component section
    default = render()
    assert _pod(default.one("StatefulSet"))["securityContext"]["runAsUser"] == 10001


def test_extra_volumes_mounts_and_sidecars() -> None:
    sidecar = {"name": "log-shipper", "image": "busybox:1.36", "args": ["sleep", "infinity"],
               "volumeMounts": [{"name": "shared", "mountPath": "/shared"}]}  # fmt: skip
    extra = {
        "extraVolumes": [{"name": "shared", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "shared", "mountPath": "/shared"}],
        "sidecars": [sidecar],
    }
    out = render({"broker": extra, "proxy": extra})
    for workload, main in ((out.one("StatefulSet"), "broker"), (out.one("Deployment"), "proxy")):
        pod = _pod(workload)
        assert [c["name"] for c in pod["containers"]] == [main, "log-shipper"]
        assert {"name": "shared", "mountPath": "/shared"} in pod["containers"][0]["volumeMounts"]
        assert {"name": "shared", "emptyDir": {}} in pod["volumes"]
        assert any(v["name"] == "config" for v in pod["volumes"])  # the chart's own stay
    _validate_all(out)


def test_top_level_comments_sit_above_their_keys() -> None:
    """Each top-level block's comment is directly above it (the config file's comment once
    sat above `monitoring:`)."""
    from deploykit import CHART_DIR

    lines = (CHART_DIR / "values.yaml").read_text().splitlines()

    def comment_above(key: str) -> str:
        at = lines.index(f"{key}:")
        block = []
        while at > 0 and lines[at - 1].startswith("#"):
            at -= 1
            block.insert(0, lines[at])
        return " ".join(block)

    assert "The popmq config file" in comment_above("config")
    assert comment_above("monitoring").startswith("# Alerts and a dashboard")


def test_network_policies() -> None:
    assert render().all("NetworkPolicy") == []  # off by default
    monitoring = [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    shop = [{"namespaceSelector": {"matchLabels": {"team": "shop"}}}]
    out = render({"networkPolicy": {"enabled": True, "clients": shop, "metrics": monitoring}})
    _validate_all(out)
    proxy_labels = out.one("Deployment")["spec"]["selector"]["matchLabels"]
    broker_labels = out.one("StatefulSet")["spec"]["selector"]["matchLabels"]
    policies = {p["spec"]["podSelector"]["matchLabels"] == proxy_labels: p
                for p in out.all("NetworkPolicy")}  # fmt: skip
    proxy, broker = policies[True]["spec"], policies[False]["spec"]
    assert broker["podSelector"]["matchLabels"] == broker_labels

    def rules(spec: dict[str, Any]) -> dict[tuple[int, ...], Any]:
        return {tuple(p["port"] for p in r["ports"]): r.get("from") for r in spec["ingress"]}

    test_pod = {"podSelector": {"matchLabels": {**proxy_labels, "app.kubernetes.io/component":
                                                "test"}}}  # fmt: skip
    assert rules(proxy) == {(8081, 8082): [*shop, test_pod], (9090,): monitoring}
    assert rules(broker) == {
        (10911,): [{"podSelector": {"matchLabels": proxy_labels}},
                   {"podSelector": {"matchLabels": broker_labels}}],  # replication
        (9090,): monitoring,
    }  # fmt: skip
    # no peers given: the port is open to any source (no `from`)
    anyone = render({"networkPolicy": {"enabled": True}})
    assert all("from" not in r for p in anyone.all("NetworkPolicy") for r in p["spec"]["ingress"]
               if r["ports"][0]["port"] != 10911)  # fmt: skip


@pytest.mark.subprocess
def test_helm_test_pod_sends_receives_and_acks(tmp_path: Path) -> None:
    """The `helm test` hook pod renders valid, reaches the proxy Service as an admin user, and
    its script really does a round trip (run here against a real `popmq serve`)."""
    import os
    import subprocess
    import sys

    from support.official_clients import start_serve

    out = render()
    (pod,) = [
        p for p in out.all("Pod") if p["metadata"]["annotations"].get("helm.sh/hook") == "test"
    ]
    _validate_all(out)
    spec = pod["spec"]
    (c,) = spec["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["ENDPOINT"] == "popmq-proxy.mq.svc.cluster.local:8081"
    assert any(v["name"] == "acl" for v in spec["volumes"])  # auth is on by default
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert render({"tests": {"enabled": False}}).all("Pod") == []
    deployment = start_serve(tmp_path / "serve")
    try:
        absent = str(tmp_path / "none")  # no ACL, no TLS: as with auth and tls off
        script_env = {**os.environ, "ENDPOINT": deployment.endpoint,
                      "ACL_FILE": absent, "CA_FILE": absent}  # fmt: skip
        done = subprocess.run([sys.executable, "-c", c["args"][0]], env=script_env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        assert deployment.stop() == [0]
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "ack accepted" in done.stdout
