"""The chart with `etcd.endpoints`: the broker StatefulSet is one broker group and proxies
follow its leader in etcd instead of listing every pod."""

from __future__ import annotations

from deploykit import NAMESPACE, container, parse_cli, render

from popmq.config import EtcdConfig

ETCD = ["http://etcd-0.etcd:2379", "http://etcd-1.etcd:2379", "http://etcd-2.etcd:2379"]


def test_without_etcd_proxies_list_every_broker() -> None:
    out = render()
    proxy = parse_cli(container(out.one("Deployment"))["args"])
    assert proxy.broker and proxy.etcd is None
    broker = parse_cli(container(out.one("StatefulSet"))["args"])
    assert broker.etcd is None and broker.group is None


def test_with_etcd_the_statefulset_is_one_group_and_proxies_follow_it() -> None:
    out = render({"etcd": {"endpoints": ETCD}})
    sts = out.one("StatefulSet")
    argv = [a.replace("$(POD_NAME)", "popmq-broker-1") for a in container(sts)["args"]]
    broker = parse_cli(argv)
    assert EtcdConfig(endpoints=broker.etcd).endpoints == ETCD
    assert broker.group == sts["metadata"]["name"]  # every pod: the same group
    assert broker.name == "popmq-broker-1"  # each pod: its own node
    host, _, port = broker.advertise.rpartition(":")
    assert host.startswith("popmq-broker-1.") and f".{NAMESPACE}.svc." in host
    assert int(port) == 10911
    proxy = parse_cli(container(out.one("Deployment"))["args"])
    assert EtcdConfig(endpoints=proxy.etcd).endpoints == ETCD
    assert not proxy.broker  # no pod list: the leader is read from etcd


GROUPS = [
    {"name": "a", "replicas": 3, "replication": "sync", "minInSync": 2},
    {"name": "b", "replicas": 5, "replication": "async", "minInSync": 3},
]


def _args(workload: dict, pod: str) -> list[str]:
    return [a.replace("$(POD_NAME)", pod) for a in container(workload)["args"]]


def test_the_chart_runs_a_three_member_etcd_that_brokers_and_proxies_use() -> None:
    out = render({"etcd": {"enabled": True}})
    etcd = out.one("StatefulSet", "popmq-etcd")
    assert etcd["spec"]["replicas"] == 3 and etcd["spec"]["podManagementPolicy"] == "Parallel"
    args = dict(a.removeprefix("--").split("=", 1) for a in container(etcd)["args"])
    peers = args["initial-cluster"].split(",")
    assert [p.split("=", 1)[0] for p in peers] == [f"popmq-etcd-{i}" for i in range(3)]
    assert all(f".popmq-etcd.{NAMESPACE}.svc.cluster.local:2380" in p for p in peers)
    service = out.one("Service", "popmq-etcd")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    assert out.one("PodDisruptionBudget", "popmq-etcd")["spec"]["maxUnavailable"] == 1
    urls = [f"http://popmq-etcd-{i}.popmq-etcd.{NAMESPACE}.svc.cluster.local:2379"
            for i in range(3)]  # fmt: skip
    broker = parse_cli(_args(out.one("StatefulSet", "popmq-broker"), "popmq-broker-0"))
    proxy = parse_cli(container(out.one("Deployment"))["args"])
    assert EtcdConfig(endpoints=broker.etcd).endpoints == urls
    assert EtcdConfig(endpoints=proxy.etcd).endpoints == urls and not proxy.broker


def test_each_broker_group_is_a_statefulset_with_its_own_pdb_and_anti_affinity() -> None:
    out = render({"etcd": {"endpoints": ETCD}, "brokerGroups": GROUPS,
                  "broker": {"antiAffinity": "required"}})  # fmt: skip
    assert {s["metadata"]["name"] for s in out.all("StatefulSet")} == {
        "popmq-broker-a", "popmq-broker-b",
    }  # fmt: skip
    for group in GROUPS:
        name = f"popmq-broker-{group['name']}"
        sts = out.one("StatefulSet", name)
        assert sts["spec"]["replicas"] == group["replicas"]
        own = {**sts["spec"]["selector"]["matchLabels"]}
        assert own["popmq.io/broker-group"] == group["name"]
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert own.items() <= labels.items()
        node = parse_cli(_args(sts, f"{name}-1"))
        assert node.group == name and node.name == f"{name}-1"
        assert (node.replication, node.min_in_sync) == (group["replication"], group["minInSync"])
        assert EtcdConfig(endpoints=node.etcd).endpoints == ETCD
        # one node of the group per Kubernetes node (required), not one per group
        [term] = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["labelSelector"]["matchLabels"] == own
        pdb = out.one("PodDisruptionBudget", name)
        assert pdb["spec"]["minAvailable"] == group["minInSync"]  # keeps min_in_sync nodes
        assert pdb["spec"]["selector"]["matchLabels"] == own
    proxy = parse_cli(container(out.one("Deployment"))["args"])
    assert EtcdConfig(endpoints=proxy.etcd).endpoints == ETCD and not proxy.broker
    assert "popmq-broker-a" in out.notes and "min in sync 2" in out.notes


def test_the_single_statefulset_keeps_its_selector_and_preferred_anti_affinity() -> None:
    sts = render({"etcd": {"enabled": True}}).one("StatefulSet", "popmq-broker")
    assert "popmq.io/broker-group" not in sts["spec"]["selector"]["matchLabels"]
    affinity = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert list(affinity) == ["preferredDuringSchedulingIgnoredDuringExecution"]


def test_etcd_pods_run_as_non_root_with_a_read_only_root_and_a_volume() -> None:
    out = render({"etcd": {"enabled": True}})
    etcd = out.one("StatefulSet", "popmq-etcd")
    pod = etcd["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    assert container(etcd)["securityContext"]["readOnlyRootFilesystem"] is True
    [mount] = container(etcd)["volumeMounts"]
    data_dir = next(a for a in container(etcd)["args"] if a.startswith("--data-dir="))
    assert data_dir.removeprefix("--data-dir=").startswith(mount["mountPath"] + "/")
    [claim] = etcd["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == mount["name"]
