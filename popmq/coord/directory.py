"""The groups registered under a prefix, read from one range of keys (see popmq.coord.keys).

Shared by the proxy (which follows leaders) and ``popmq admin cluster status``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from popmq.coord.keys import decode, split_key
from popmq.coord.store import KeyValue


@dataclass(frozen=True, slots=True)
class Leader:
    name: str
    address: str
    epoch: int  # the leader key's create_revision


@dataclass(frozen=True, slots=True)
class Lag:
    lag_bytes: int | None
    lag_s: float | None


@dataclass(slots=True)
class GroupView:
    name: str
    leader: Leader | None = None
    members: dict[str, str] = field(default_factory=dict)  # node -> address (alive nodes)
    in_sync: list[str] = field(default_factory=list)
    draining: bool = False
    lag: dict[str, Lag] = field(default_factory=dict)  # node -> as its leader reported it


def read_groups(prefix: str, kvs: Iterable[KeyValue]) -> dict[str, GroupView]:
    """Every group with at least one key, by name (sorted)."""
    groups: dict[str, GroupView] = {}
    for kv in kvs:
        parts = split_key(prefix, kv.key)
        if parts is None:
            continue
        name, rest = parts
        view = groups.setdefault(name, GroupView(name))
        value = decode(kv.value)
        if rest == "leader":
            view.leader = Leader(str(value.get("name", "")), str(value.get("address", "")),
                                 kv.create_revision)  # fmt: skip
        elif rest == "in_sync":
            view.in_sync = [str(m) for m in value.get("members", [])]
        elif rest == "drain":
            view.draining = True
        elif rest.startswith("members/"):
            view.members[rest.removeprefix("members/")] = str(value.get("address", ""))
        elif rest.startswith("lag/"):
            view.lag[rest.removeprefix("lag/")] = Lag(_int(value.get("lag_bytes")),
                                                      _float(value.get("lag_s")))  # fmt: skip
    return dict(sorted(groups.items()))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def status_json(groups: dict[str, GroupView]) -> dict[str, object]:
    """`popmq admin cluster status --json`: numbers as numbers; a lag is null until
    replication reports it."""
    out = []
    for view in groups.values():
        leader = view.leader.name if view.leader else None
        nodes = []
        for node in sorted({*view.members, *view.in_sync, *([leader] if leader else [])}):
            lag = view.lag.get(node)
            role = "leader" if node == leader else ("follower" if node in view.members else "down")
            nodes.append({
                "name": node,
                "role": role,
                "lag_bytes": 0 if role == "leader" else (lag.lag_bytes if lag else None),
                "lag_s": 0.0 if role == "leader" else (lag.lag_s if lag else None),
            })  # fmt: skip
        out.append({
            "name": view.name,
            "leader": leader,
            "epoch": view.leader.epoch if view.leader else 0,
            "in_sync": list(view.in_sync),
            "draining": view.draining,
            "nodes": nodes,
        })  # fmt: skip
    return {"groups": out}
