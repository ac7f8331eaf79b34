"""`popmq handle-keys` as README.md and docs/security.md write it: the keyring flags after the
verb (`handle-keys rotate --data-dir DIR`), and before it as well."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from popmq.broker.pop.handle_keys import HandleKeyring

from popmq.cli import main
from popmq.config import BrokerConfig


def _keyring(data_dir: Path) -> str:
    return HandleKeyring.open(BrokerConfig(name="b", data_dir=data_dir)).active_id


def test_documented_forms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = tmp_path / "b"
    first = _keyring(data_dir)
    assert main(["handle-keys", "rotate", "--data-dir", str(data_dir)]) == 0
    second = capsys.readouterr().out.split()[-1]
    assert second != first
    assert main(["handle-keys", "--data-dir", str(data_dir), "list"]) == 0
    listed = capsys.readouterr().out
    assert first in listed and f"{second}" in listed and "active" in listed
    assert main(["handle-keys", "retire", first, "--data-dir", str(data_dir)]) == 0
    assert capsys.readouterr().out.strip() == f"retired {first}"
    path = data_dir / "handle-keys.json"
    assert main(["handle-keys", "list", "--file", str(path)]) == 0
    assert first not in capsys.readouterr().out
    assert json.loads(path.read_text())["active"] == second


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["handle-keys", "list"], "one of the arguments --data-dir --file is required"),
        (["handle-keys", "--file", "f", "list", "--data-dir", "d"], "not allowed with"),
    ],
)
def test_usage_errors_exit_2(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(args)
    assert stopped.value.code == 2
    assert needle in capsys.readouterr().err
