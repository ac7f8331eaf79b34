"""The README's quick start (official Python client) works as written against `popmq serve`."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from support.official_clients import CLIENT_PYTHON, REPO, Deployment

pytestmark = [
    pytest.mark.client,
    pytest.mark.skipif(not CLIENT_PYTHON.exists(), reason="run `make client-venv` first"),
]

_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
DEFAULT_ENDPOINTS = ("127.0.0.1:8081", "localhost:8081")


def quickstart_blocks() -> list[str]:
    readme = REPO / "README.md"
    if not readme.exists():
        return []
    return [b for b in _BLOCK.findall(readme.read_text()) if "from rocketmq import" in b]


def test_readme_quickstart_runs(serve_deployment: Deployment, tmp_path) -> None:
    blocks = quickstart_blocks()
    assert blocks, "README.md lost its official-client quick start (```python with rocketmq)"
    for index, block in enumerate(blocks):
        code = block
        for default in DEFAULT_ENDPOINTS:
            code = code.replace(default, serve_deployment.endpoint)
        script = tmp_path / f"quickstart_{index}.py"
        script.write_text(code)
        result = subprocess.run(
            [str(CLIENT_PYTHON), str(script)], cwd=tmp_path, capture_output=True, text=True,
            timeout=120, env=dict(os.environ, HOME=str(tmp_path)),
        )  # fmt: skip
        assert result.returncode == 0, f"block {index}:\n{result.stdout}\n{result.stderr}"
