"""`popmq serve` runs embedded brokers that are never replicated: settings asking for
replication, a group or etcd are refused with a clear message (exit 2), not silently ignored."""

from __future__ import annotations

import pytest

from popmq.cli import main


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (["broker.replication.mode=sync", "broker.replication.min_in_sync=2"],
         "broker.replication.mode=sync"),
        (["broker.replication.mode=async"], "broker.replication.mode=async"),
        (["broker.etcd.endpoints=http://127.0.0.1:2379", "broker.group.name=ga"],
         "broker.group.name=ga"),
        # Its proxy then followed etcd's groups and warned of etcd, beside its own brokers.
        (["proxy.etcd.endpoints=http://127.0.0.1:2379"], "proxy.etcd.endpoints"),
    ],
)  # fmt: skip
def test_serve_refuses_replication_settings(
    settings: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--port", "0"]
    for item in settings:
        argv += ["--set", item]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("popmq serve: ") and named in err
    assert "popmq broker --etcd" in err and err.count("\n") == 1  # one line, no traceback
