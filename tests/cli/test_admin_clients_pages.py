"""`popmq admin clients` (and `groups describe`) follow ListClients' pages to the last."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from popmq.cli import admin_cmd
from popmq.pb.admin.v1 import admin_pb2 as a


def test_every_page_is_fetched_and_merged(monkeypatch: pytest.MonkeyPatch) -> None:
    pages = {
        "": a.ListClientsResponse(
            proxy="p:1", clients=[a.Client(client_id="c1")], next_page_token="t1"
        ),
        "t1": a.ListClientsResponse(
            proxy="p:1", clients=[a.Client(client_id="c2")], next_page_token="t2"
        ),
        "t2": a.ListClientsResponse(proxy="p:1", clients=[a.Client(client_id="c3")]),
    }
    asked: list[tuple[str, str]] = []

    def fake_call(args: argparse.Namespace, method: str, request: Any) -> Any:
        asked.append((request.group, request.page_token))
        return pages[request.page_token]

    monkeypatch.setattr(admin_cmd, "_call", fake_call)
    merged = admin_cmd._all_clients(argparse.Namespace(), "g")
    assert [c.client_id for c in merged.clients] == ["c1", "c2", "c3"]
    assert (merged.proxy, merged.next_page_token) == ("p:1", "")
    assert asked == [("g", ""), ("g", "t1"), ("g", "t2")]
