"""Group registration is O(1) (an append-only log, no rewrite or fsync per new group), old
groups.json files migrate, damage falls back visibly; auto-creation is bounded
(issue 9, defects 6, 7 and 9)."""

from __future__ import annotations

import itertools
import json
import logging
import os
from types import SimpleNamespace

import pytest
from popmq.broker.auto_create import AutoCreateGate
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import GroupConfig
from popmq.broker.pop.groups import GroupRegistry
from popmq.broker.store.damage import StoreFaults

from popmq.config import GroupDefaults, PopConfig


def _store(tmp_path, was_new: bool = True) -> SimpleNamespace:
    return SimpleNamespace(data_dir=tmp_path, was_new=was_new, faults=StoreFaults())


def registry(tmp_path, **defaults) -> GroupRegistry:
    store = _store(tmp_path)
    reg = GroupRegistry(store, PopConfig(), GroupDefaults(**defaults))  # type: ignore[arg-type]
    reg.load()
    return reg


def test_new_groups_cost_no_fsync_and_no_rewrite(tmp_path, monkeypatch) -> None:
    reg = registry(tmp_path)
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd)))
    sizes = []
    for i in range(400):
        reg.get(f"g{i}")
        sizes.append(os.path.getsize(tmp_path / "state" / "groups.log"))
    assert fsyncs == []
    # Appends only: every new group adds about the same few bytes (no whole-file rewrite).
    growth = [b - a for a, b in itertools.pairwise(sizes)]
    assert max(growth) < 200
    reg.update(GroupConfig(name="g7", max_attempts=3, fifo=True))
    assert len(fsyncs) == 1  # an explicit update is durable before it is acknowledged
    reg.close()

    again = registry(tmp_path)
    assert len(again) == 400
    assert again.get("g7").max_attempts == 3 and again.get("g7").fifo
    assert again.get("g399").max_attempts == PopConfig().max_attempts


def test_old_groups_json_is_migrated(tmp_path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    old = {"a": {"name": "a", "max_attempts": 5, "fifo": True}, "b": {"name": "b"}}
    (state / "groups.json").write_text(json.dumps(old))
    reg = registry(tmp_path)
    assert reg.get("a").max_attempts == 5 and reg.get("a").fifo
    assert len(reg) == 2
    assert not (state / "groups.json").exists()
    assert (state / "groups.json.migrated").exists()
    reg.close()
    assert registry(tmp_path).get("a").max_attempts == 5


def test_corrupt_groups_json_falls_back_visibly(tmp_path, caplog) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "groups.json").write_text('{"a": {"name": "a", "max_att')
    with caplog.at_level(logging.ERROR):
        reg = registry(tmp_path)  # no JSONDecodeError traceback: the broker starts
    assert reg.damaged_records == 1
    assert any("unreadable" in r.getMessage() for r in caplog.records)
    assert (state / "groups.json.corrupt").exists()  # kept for the operator, never deleted
    assert reg.get("a").name == "a"  # back to the defaults


def test_torn_log_tail_keeps_earlier_groups(tmp_path, caplog) -> None:
    reg = registry(tmp_path)
    reg.update(GroupConfig(name="keep", max_attempts=4))
    reg.get("lost")
    reg.close()
    path = tmp_path / "state" / "groups.log"
    data = path.read_bytes()
    path.write_bytes(data[:-3])  # a torn last record
    with caplog.at_level(logging.ERROR):
        again = registry(tmp_path)
    assert again.get("keep").max_attempts == 4
    assert again.damaged_records == 1
    assert any("damaged" in r.getMessage() for r in caplog.records)


def test_group_auto_creation_limits(tmp_path) -> None:
    refused: list[tuple[str, str]] = []
    store = _store(tmp_path)
    reg = GroupRegistry(store, PopConfig(), GroupDefaults(max_auto_created=3),  # type: ignore[arg-type]
                        lambda kind, reason: refused.append((kind, reason)))  # fmt: skip
    reg.load()
    for name in ("a", "b", "c"):
        reg.get(name)
    with pytest.raises(RefusedError) as err:
        reg.get("d")
    assert err.value.code == Code.CONSUMER_GROUP_NOT_FOUND
    assert "max_auto_created" in err.value.message
    assert refused == [("group", "total")]
    reg.get("a")  # existing groups are unaffected
    reg.update(GroupConfig(name="d"))  # explicit creation is not auto-creation
    assert reg.settings("zzz").name == "zzz"  # revive's lookup never registers nor refuses
    off = registry(tmp_path / "off", auto_create=False)
    with pytest.raises(RefusedError) as err:
        off.get("x")
    assert err.value.code == Code.CONSUMER_GROUP_NOT_FOUND and "auto_create" in err.value.message


def test_rate_gate_refills_with_time() -> None:
    now = [0.0]
    gate = AutoCreateGate("topic", True, 1_000, 2.0, clock=lambda: now[0])
    gate.admit("a", 0)
    gate.admit("b", 1)
    with pytest.raises(RefusedError) as err:
        gate.admit("c", 2)
    assert err.value.code == Code.TOPIC_NOT_FOUND and "per second" in err.value.message
    now[0] += 0.5
    gate.admit("c", 2)


def test_delete_is_a_tombstone_that_survives_restart_and_compaction(tmp_path) -> None:
    reg = registry(tmp_path)
    reg.update(GroupConfig(name="gone", max_attempts=3))
    reg.update(GroupConfig(name="kept", max_attempts=4))
    size = os.path.getsize(tmp_path / "state" / "groups.log")
    reg.delete("gone")
    assert os.path.getsize(tmp_path / "state" / "groups.log") > size  # appended, no rewrite
    assert [c.name for c in reg.configs()] == ["kept"]
    with pytest.raises(RefusedError) as err:
        reg.delete("gone")
    assert err.value.code == Code.CONSUMER_GROUP_NOT_FOUND
    reg.close()
    again = registry(tmp_path)
    assert [c.name for c in again.configs()] == ["kept"]
    assert again.get("gone").max_attempts == PopConfig().max_attempts  # re-created, defaults
    again._rewrite()  # compaction keeps the live groups only
    again.close()
    assert [c.name for c in registry(tmp_path).configs()] == ["gone", "kept"]


def test_missing_log_of_an_existing_data_dir_is_noticed(tmp_path, caplog) -> None:
    reg = registry(tmp_path)
    reg.update(GroupConfig(name="g", max_attempts=2))
    reg.close()
    (tmp_path / "state" / "groups.log").unlink()
    store = _store(tmp_path, was_new=False)
    with caplog.at_level(logging.ERROR):
        GroupRegistry(store, PopConfig()).load()  # type: ignore[arg-type]
    assert [(m.file, m.action, m.problem) for m in store.faults.metadata] == [
        ("state/groups.log", "reset", "missing")
    ]
    assert any("missing" in r.getMessage() for r in caplog.records)
    fresh = _store(tmp_path / "new", was_new=True)
    GroupRegistry(fresh, PopConfig()).load()  # type: ignore[arg-type]
    assert fresh.faults.metadata == []  # a new data dir has no groups yet: nothing to report


def test_damage_inside_the_log_is_counted(tmp_path) -> None:
    reg = registry(tmp_path)
    for name in ("a", "b", "c"):
        reg.update(GroupConfig(name=name, max_attempts=3))
    reg.close()
    path = tmp_path / "state" / "groups.log"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the middle record: valid frames follow
    path.write_bytes(bytes(data))
    store = _store(tmp_path, was_new=False)
    again = GroupRegistry(store, PopConfig())  # type: ignore[arg-type]
    again.load()
    assert again.damaged_records >= 1
    assert [m.file for m in store.faults.metadata] == ["state/groups.log"]
    assert {c.name for c in again.configs()} >= {"a", "c"}
    assert list((tmp_path / "quarantine").glob("state_groups.log.*.bin"))  # bytes kept
    again.close()
    later = _store(tmp_path, was_new=False)
    GroupRegistry(later, PopConfig()).load()  # type: ignore[arg-type]
    assert later.faults.metadata == []  # reported once: the log was rewritten clean
