"""Lay out the package as it installs, for `make lint`: build/layers/popmq, with broker/ and
proxy/ inside it as setup.py maps them (import-linter and mypy read the installed names, and
mypy does not follow the editable install's folder mapping).

`pip install --target` built the same tree in 5 to 25 s; this takes a fraction of a second.
Files are hard links (a copy where links fail), so they keep their modification times and
mypy's incremental cache (.mypy_cache) re-checks only what changed. The mapping is read from
setup.py, the one place it is written.

    python scripts/layers_tree.py [DEST]   (default: build/layers)
"""

from __future__ import annotations

import ast
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")


def mapped_folders() -> dict[str, str]:
    """setup.py's MAPPED: installed package name -> folder in the repository."""
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "MAPPED" for target in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, dict)
            return value
    raise SystemExit("setup.py has no MAPPED = {...}: the tree cannot be laid out")


def link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def lay_out(dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    folders = {"popmq": "popmq", **mapped_folders()}
    for package, folder in sorted(folders.items()):  # popmq first, then popmq.broker, ...
        target = dest.joinpath(*package.split("."))
        shutil.copytree(REPO / folder, target, ignore=SKIP, copy_function=link_or_copy,
                        dirs_exist_ok=True)  # fmt: skip


if __name__ == "__main__":
    lay_out(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "build" / "layers")
