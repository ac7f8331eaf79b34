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
