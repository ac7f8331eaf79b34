"""The Helm chart, rendered by Helm's real engine and checked against Kubernetes' schemas, the
config model the servers load, and the CLI they run."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploykit import (
    CHART_DIR,
    NAMESPACE,
    Manifest,
    Rendered,
    container,
    helm,
    load_values_file,
    parse_cli,
    pod_env,
    render,
    walk,
)

from popmq.config import BrokerAddress, PopmqConfig, load_config
from popmq.security.acl import Acl

pytestmark = pytest.mark.slow  # scheduled first in make check (tests/conftest.py)

kubernetes_validate = pytest.importorskip("kubernetes_validate")

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion: native gRPC probes) and the
# newest the offline schemas know.
KUBE_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())

VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "dev-example": load_values_file("values-dev.yaml"),
    "production-example": load_values_file("values-production.yaml"),
    "external-example": load_values_file("values-external.yaml"),
    "pod-ip-five-brokers": {
        "fullnameOverride": "mq",
        "clusterDomain": "corp.local",
        "serviceAccount": {"create": False},
        "broker": {
            "replicas": 5,
            "persistence": {"storageClass": "-"},
            "pdb": {"enabled": False},
            "metrics": {"enabled": False},
        },
        "proxy": {
            "advertise": {"podIP": True},
            "metrics": {"enabled": False},
            "pdb": {"maxUnavailable": "50%"},
        },
    },
    "auth-and-tls-from-secrets": {
        "auth": {"enabled": True, "existingSecret": "my-users", "existingSecretKey": "users.yaml"},
        "clusterToken": {"existingSecret": "my-token", "existingSecretKey": "token"},
        "tls": {
            "enabled": True,
            "secretName": "proxy-cert",
            "clientAuth": True,
            "brokers": {"enabled": True, "secretName": "broker-cert", "mutual": True},
        },
    },
    "auth-off": {"auth": {"enabled": False}, "proxy": {"adminPort": None}},
    "tuned-config": {
        "clusterToken": {"value": "kSecretForTheTuningVariant123"},
        "proxy": {
            "terminationGracePeriodSeconds": 40,
            "advertise": {"host": "mq.internal.example", "port": 443},
        },
        "config": {
            "broker": {
                "store": {"flush": "sync", "retention_hours": 0.5, "segment_bytes": 1048576},
                "pop": {"retry_levels": ["1s", "10s", "1m"], "max_attempts": 3},
                "topics": {"auto_create": False, "queue_count": 2},
            },
            "proxy": {
                "strategy": "notify",
                "min_long_polling_ms": 1000,
                "max_long_polling_ms": 30000,
                "notify_threshold_rps": 12.5,
            },
        },
    },
}


# Replicated broker groups on the chart's own etcd: several StatefulSets (the checks above
# that expect one are in test_helm_groups.py); linted and validated like every variant.
HA_VARIANTS: dict[str, dict[str, Any]] = {
    "ha-groups-own-etcd": {
        "etcd": {"enabled": True},
        "brokerGroups": [
            {"name": "a", "replicas": 3, "replication": "sync", "minInSync": 2},
            {"name": "b", "replicas": 3, "replication": "async", "minInSync": 1},
        ],
        "broker": {"antiAffinity": "required"},
        "networkPolicy": {"enabled": True},
    },
}
ALL_VARIANTS = {**VARIANTS, **HA_VARIANTS}


@pytest.fixture(scope="module")
def rendered() -> dict[str, Rendered]:
    return {name: render(values) for name, values in ALL_VARIANTS.items()}


def merged_values(values: dict[str, Any]) -> dict[str, Any]:
    """The values an install would use: Helm's own coalescing of defaults and overrides."""
    with helm.Chart.load(str(CHART_DIR)) as chart:
        return chart.merge_values(values)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_chart_lints_clean(variant: str) -> None:
    report = helm.lint(str(CHART_DIR), ALL_VARIANTS[variant], strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    assert serious == []


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_every_manifest_is_valid_kubernetes(rendered: dict[str, Rendered], variant: str) -> None:
    out = rendered[variant]
    assert out.manifests, "nothing rendered"
    for manifest in out.manifests:
        if manifest["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD; checked by test_service_monitor_selects_the_metrics_service
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(manifest, version, strict=True)
        assert manifest["metadata"]["namespace"] == NAMESPACE
        assert len(manifest["metadata"]["name"]) <= 63


def test_the_kubernetes_validator_rejects_broken_manifests(rendered: dict[str, Rendered]) -> None:
    """A control: the same validation fails on a wrong type and on an unknown field."""
    sts = copy.deepcopy(rendered["defaults"].one("StatefulSet"))
    sts["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBE_VERSIONS[-1], strict=True)
    deploy = copy.deepcopy(rendered["defaults"].one("Deployment"))
    container(deploy)["readinessProbe"]["grpcc"] = {"port": 8081}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deploy, KUBE_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_config_map_loads_into_the_config_model(
    rendered: dict[str, Rendered], variant: str, tmp_path: Path
) -> None:
    out = rendered[variant]
    values = merged_values(VARIANTS[variant])
    path = tmp_path / "popmq.yaml"
    path.write_text(out.config_text())
    secret = "unused"  # no secret travels in the environment any more: they are files

    for workload in (out.one("StatefulSet"), out.one("Deployment")):
        config = load_config(path, environ=pod_env(workload, secret))
        assert isinstance(config, PopmqConfig)
        assert not any("SECRET" in name for name in pod_env(workload, secret))
        # Every value under `config` reached the model unchanged.
        for dotted, expected in walk(values["config"]):
            actual: Any = config
            for part in dotted.split("."):
                actual = getattr(actual, part)
            assert actual == expected, f"config.{dotted}: values {expected!r}, loaded {actual!r}"

    proxy = load_config(path, environ=pod_env(out.one("Deployment"), secret)).proxy
    advertise = values["proxy"]["advertise"]
    if advertise["podIP"]:
        assert proxy.advertise_host == "10.0.0.7"  # from the downward API env
        assert proxy.advertise_port == values["proxy"]["port"]
    elif advertise["host"]:
        assert proxy.advertise_host == advertise["host"]
        assert proxy.advertise_port == (advertise.get("port") or values["proxy"]["service"]["port"])
    else:  # routes echo the address each client connected to
        assert (proxy.advertise_host, proxy.advertise_port) == (None, None)


@pytest.mark.parametrize("variant", VARIANTS)
def test_proxies_address_every_broker_by_its_stable_name(
    rendered: dict[str, Rendered], variant: str
) -> None:
    out = rendered[variant]
    values = merged_values(VARIANTS[variant])
    sts = out.one("StatefulSet")
    headless = out.one("Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    port = values["broker"]["port"]
    assert headless["spec"]["ports"][0]["port"] == port

    args = container(out.one("Deployment"))["args"]
    brokers = [BrokerAddress.parse(args[i + 1]) for i, a in enumerate(args) if a == "--broker"]
    pods = [f"{sts['metadata']['name']}-{i}" for i in range(sts["spec"]["replicas"])]
    assert [b.name for b in brokers] == pods
    domain = values["clusterDomain"]
    assert [b.address for b in brokers] == [
        f"{pod}.{headless['metadata']['name']}.{NAMESPACE}.svc.{domain}:{port}" for pod in pods
    ]
    # The broker's --name is its pod name, the name the proxies use.
    broker_args = container(sts)["args"]
    assert broker_args[broker_args.index("--name") + 1] == "$(POD_NAME)"
    env = {e["name"]: e for e in container(sts)["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


@pytest.mark.parametrize("variant", VARIANTS)
def test_broker_command_parses_with_the_real_cli(
    rendered: dict[str, Rendered], variant: str
) -> None:
    out = rendered[variant]
    broker = container(out.one("StatefulSet"))
    assert broker["command"] == ["popmq"]
    argv = [a.replace("$(POD_NAME)", "popmq-broker-0") for a in broker["args"]]
    args = parse_cli(argv)
    assert args.command == "broker"
    assert args.config == "/etc/popmq/popmq.yaml"
    assert (args.name, args.host, args.port) == ("popmq-broker-0", "0.0.0.0", 10911)
    values = merged_values(VARIANTS[variant])
    metrics = values["broker"]["metrics"]
    assert args.metrics_port == (metrics["port"] if metrics["enabled"] else None)
    annotations = out.one("StatefulSet")["spec"]["template"]["metadata"]["annotations"]
    if metrics["enabled"] and metrics["podAnnotations"]:
        assert annotations["prometheus.io/port"] == str(args.metrics_port)
        ports = {p["name"]: p["containerPort"] for p in broker["ports"]}
        assert ports["metrics"] == args.metrics_port
    else:
        assert "prometheus.io/scrape" not in annotations
    mount = next(m for m in broker["volumeMounts"] if m["name"] == "data")["mountPath"]
    assert Path(args.data_dir).is_relative_to(mount), "broker data must live on the volume"


@pytest.mark.parametrize("variant", VARIANTS)
def test_proxy_command_parses_with_the_real_cli(
    rendered: dict[str, Rendered], variant: str
) -> None:
    out = rendered[variant]
    values = merged_values(VARIANTS[variant])
    proxy = container(out.one("Deployment"))
    assert proxy["command"] == ["popmq"]
    args = parse_cli(proxy["args"])
    assert args.command == "proxy"
    assert (args.host, args.port) == ("0.0.0.0", values["proxy"]["port"])
    metrics_port = (
        values["proxy"]["metrics"]["port"] if values["proxy"]["metrics"]["enabled"] else None
    )
    assert getattr(args, "metrics_port", None) == metrics_port


@pytest.mark.parametrize("variant", VARIANTS)
def test_services_probes_and_ports_line_up(rendered: dict[str, Rendered], variant: str) -> None:
    out = rendered[variant]
    workloads = {"broker": out.one("StatefulSet"), "proxy": out.one("Deployment")}
    for service in out.all("Service"):
        selector = service["spec"]["selector"]
        targets = [
            w for w in workloads.values()
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]  # fmt: skip
        assert len(targets) == 1, f"Service {service['metadata']['name']} selects {len(targets)}"
        port_names = {p["name"] for p in container(targets[0])["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names
    for workload in workloads.values():
        spec = workload["spec"]
        assert (
            spec["selector"]["matchLabels"].items()
            <= spec["template"]["metadata"]["labels"].items()
        )
        c = container(workload)
        grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
        tls = "--tls-cert" in c["args"]
        for probe in ("readinessProbe", "livenessProbe"):
            if tls:  # kubelet's gRPC probe cannot speak TLS
                assert c[probe]["tcpSocket"] == {"port": grpc_port}
            else:
                assert c[probe]["grpc"] == {"port": grpc_port}, "probes use grpc.health.v1"
    startup = container(workloads["broker"])["startupProbe"]
    assert (startup.get("grpc") or startup["tcpSocket"])["port"] == 10911
    for pdb in out.all("PodDisruptionBudget"):
        labels = pdb["spec"]["selector"]["matchLabels"]
        assert any(labels.items() <= w["spec"]["template"]["metadata"]["labels"].items()
                   for w in workloads.values())  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
def test_pods_run_as_non_root_with_a_read_only_root(
    rendered: dict[str, Rendered], variant: str
) -> None:
    out = rendered[variant]
    for workload in (out.one("StatefulSet"), out.one("Deployment")):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        c = container(workload)
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], "/tmp is the only scratch space"
        fullname = out.one("StatefulSet")["metadata"]["name"].removesuffix("-broker")
        config_map = out.one("ConfigMap", f"{fullname}-config")  # not the dashboard's
        assert volumes[mounts["/etc/popmq"]]["configMap"]["name"] == config_map["metadata"]["name"]
    claim = out.one("StatefulSet")["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "data"


def test_variant_specific_resources(rendered: dict[str, Rendered]) -> None:
    base = rendered["defaults"]
    assert base.maybe("HorizontalPodAutoscaler") is None
    assert base.maybe("ServiceMonitor") is None
    assert base.one("Deployment")["spec"]["replicas"] == 2
    assert len(base.all("PodDisruptionBudget")) == 2
    annotations = base.one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9090"
    assert (
        "storageClassName" not in base.one("StatefulSet")["spec"]["volumeClaimTemplates"][0]["spec"]
    )

    prod = rendered["production-example"]
    # Production creates nothing on first use (issue 9: a flood of names exhausts a broker).
    prod_config = yaml.safe_load(prod.config_text())["broker"]
    assert prod_config["topics"]["auto_create"] is False
    assert prod_config["groups"]["auto_create"] is False
    hpa = prod.one("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == prod.one("Deployment")["metadata"]["name"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    assert "replicas" not in prod.one("Deployment")["spec"], "the HPA owns the replica count"
    assert prod.maybe("Secret") is None, "existingSecret: the chart makes no Secret"
    volumes = {v["name"]: v for v in prod.one("StatefulSet")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["cluster-token"]["secret"] == {
        "defaultMode": 0o440,
        "secretName": "popmq-cluster-token",
        "items": [{"key": "cluster-token", "path": "token"}],
    }
    claim = prod.one("StatefulSet")["spec"]["volumeClaimTemplates"][0]["spec"]
    assert (claim["storageClassName"], claim["resources"]["requests"]["storage"]) == (
        "fast-ssd",
        "200Gi",
    )

    ext = rendered["external-example"]
    svc = ext.one("Service", "popmq-proxy")
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    assert "mq.internal.example:443" in rendered["tuned-config"].notes

    pod_ip = rendered["pod-ip-five-brokers"]
    assert pod_ip.maybe("ServiceAccount") is None
    assert pod_ip.all("PodDisruptionBudget")[0]["metadata"]["name"] == "mq-proxy"
    assert pod_ip.maybe("ServiceMonitor") is None
    assert [s["metadata"]["name"] for s in pod_ip.all("Service")] == [
        "mq-broker-headless",
        "mq-proxy",
    ]
    claim = pod_ip.one("StatefulSet")["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["storageClassName"] == ""
    assert "--metrics-port" not in container(pod_ip.one("Deployment"))["args"]


def test_service_monitor_selects_the_metrics_service(rendered: dict[str, Rendered]) -> None:
    out = rendered["production-example"]
    monitor = out.one("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [
        s for s in out.all("Service") if selector.items() <= s["metadata"]["labels"].items()
    ]
    assert [s["metadata"]["name"] for s in services] == ["popmq-proxy-metrics"]
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] in {p["name"] for p in services[0]["spec"]["ports"]}
    assert (endpoint["path"], endpoint["interval"]) == ("/metrics", "15s")
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]


def test_config_changes_roll_the_right_pods() -> None:
    def checksums(values: dict[str, Any]) -> tuple[str, str]:
        out = render(values)
        sts, dep = out.one("StatefulSet"), out.one("Deployment")
        return (
            sts["spec"]["template"]["metadata"]["annotations"]["checksum/config"],
            dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"],
        )

    broker0, proxy0 = checksums({})
    broker1, proxy1 = checksums({"config": {"proxy": {"min_long_polling_ms": 2000}}})
    assert broker1 == broker0, "proxy tuning must not restart brokers"
    assert proxy1 != proxy0
    broker2, proxy2 = checksums({"config": {"broker": {"pop": {"max_attempts": 5}}}})
    assert broker2 != broker0
    assert proxy2 != proxy0


def test_generated_cluster_token_and_admin_user(rendered: dict[str, Rendered]) -> None:
    out = rendered["defaults"]
    token = out.secret_file("popmq-cluster-token", "cluster-token")
    assert len(token) >= 32 and token[0].isalpha()
    assert rendered["tuned-config"].secret_file("popmq-cluster-token", "cluster-token") == (
        "kSecretForTheTuningVariant123"
    )
    acl_secret = out.one("Secret", "popmq-acl")
    assert acl_secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    acl = Acl.model_validate(yaml.safe_load(out.secret_file("popmq-acl", "acl.yaml")))
    (admin,) = acl.users
    assert admin.access_key == "admin" and admin.admin
    assert len(admin.secret_key.get_secret_value()) >= 32
    assert rendered["auth-off"].maybe("Secret")["metadata"]["name"] == "popmq-cluster-token"
    assert "--acl" not in container(rendered["auth-off"].one("Deployment"))["args"]


def _mounted(workload: Manifest, path: str) -> tuple[dict[str, Any], str]:
    """The Secret volume and file name behind a file path in a pod of this workload."""
    pod = workload["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in container(workload)["volumeMounts"]}
    directory, _, name = path.rpartition("/")
    volume = next(v for v in pod["volumes"] if v["name"] == mounts[directory])
    return volume["secret"], name


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_security_file_comes_from_a_secret(
    rendered: dict[str, Rendered], variant: str
) -> None:
    out = rendered[variant]
    values = merged_values(VARIANTS[variant])
    broker = parse_cli(
        [a.replace("$(POD_NAME)", "b-0") for a in container(out.one("StatefulSet"))["args"]]
    )
    proxy = parse_cli(container(out.one("Deployment"))["args"])
    token_secret = values["clusterToken"]["existingSecret"] or "popmq-cluster-token"
    if VARIANTS[variant].get("fullnameOverride"):
        token_secret = f"{VARIANTS[variant]['fullnameOverride']}-cluster-token"
    for workload, path in ((out.one("StatefulSet"), broker.cluster_token_file),
                           (out.one("Deployment"), proxy.cluster_token_file)):  # fmt: skip
        secret, name = _mounted(workload, path)
        assert secret["secretName"] == token_secret and secret["items"][0]["path"] == name
        assert secret["defaultMode"] == 0o440  # not the 0644 default: popmq warns about it
    if values["auth"]["enabled"]:
        secret, name = _mounted(out.one("Deployment"), proxy.acl)
        assert secret["defaultMode"] == 0o440
        assert secret["items"] == [{"key": values["auth"]["existingSecretKey"]
                                    if values["auth"]["existingSecret"] else "acl.yaml",
                                    "path": name}]  # fmt: skip
    else:
        assert proxy.acl is None
    tls = values["tls"]
    assert (proxy.tls_cert is not None) == tls["enabled"]
    assert (proxy.tls_client_ca is not None) == bool(tls["enabled"] and tls.get("clientAuth"))
    if tls["enabled"]:
        assert _mounted(out.one("Deployment"), proxy.tls_cert)[0]["secretName"] == tls["secretName"]
    brokers = tls["brokers"]
    assert (broker.tls_cert is not None) == brokers["enabled"]
    assert (proxy.broker_tls_ca is not None) == brokers["enabled"]
    if brokers["enabled"]:
        assert (
            _mounted(out.one("StatefulSet"), broker.tls_cert)[0]["secretName"]
            == (brokers["secretName"])
        )
        assert (
            _mounted(out.one("Deployment"), proxy.broker_tls_ca)[0]["secretName"]
            == (brokers["secretName"])
        )
        assert (broker.tls_client_ca is not None) == bool(brokers.get("mutual"))
        assert (proxy.broker_tls_cert is not None) == bool(brokers.get("mutual"))
        # replication runs on the broker port: followers verify their leader with its CA
        [replication_ca] = [s.split("=", 1)[1] for s in getattr(broker, "set", None) or []
                            if s.startswith("broker.replication.tls_ca=")]  # fmt: skip
        assert (
            _mounted(out.one("StatefulSet"), replication_ca)[0]["secretName"]
            == brokers["secretName"]
        )
    admin_port = values["proxy"].get("adminPort")  # null removes the key
    assert proxy.admin_port == admin_port
    ports = {p["name"]: p["containerPort"] for p in container(out.one("Deployment"))["ports"]}
    assert ports.get("admin") == admin_port
    service = out.one("Service", out.one("Deployment")["metadata"]["name"])
    assert admin_port not in [p["port"] for p in service["spec"]["ports"]], "admin stays off"


def test_notes_tell_how_to_connect(rendered: dict[str, Rendered]) -> None:
    notes = rendered["defaults"].notes
    assert "popmq-proxy.mq.svc.cluster.local:8081" in notes
    assert "ClientConfiguration(" in notes and "SimpleConsumer(" in notes
    assert "the address the client connected to" in notes
    dev = rendered["dev-example"].notes
    assert "port-forward svc/popmq-proxy 8081:8081" in dev
    assert "awaitDuration is clamped to [1000 ms, 20000 ms]" in dev
    assert "IP of the proxy pod" in rendered["pod-ip-five-brokers"].notes


def test_example_values_files_are_what_the_docs_say() -> None:
    for name in ("values-dev.yaml", "values-production.yaml", "values-external.yaml"):
        assert name in (CHART_DIR.parents[1] / "deploy" / "k8s" / "README.md").read_text()
        assert yaml.safe_load((CHART_DIR.parents[1] / "deploy" / "k8s" / name).read_text())
