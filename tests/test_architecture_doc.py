"""docs/architecture.md stays true to the tree: every path, file and Class.method it names exists
(a reader following a send or a receive through it finds each step)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text()
TOPS = ("broker", "proxy", "popmq", "pyspark_popmq", "tests", "protos", "scripts", "docs")
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOPS) + r")/[\w./-]*[\w/])")
FILE = re.compile(r"(?<![\w/])([a-z_0-9]+\.py)\b")
METHOD = re.compile(r"`([A-Z]\w*)\.([a-z_]\w*)`")


def _sources() -> str:
    files = [p for top in ("broker", "proxy", "popmq") for p in (ROOT / top).rglob("*.py")]
    files += (ROOT / "protos").rglob("*.proto")  # messages and their fields
    return "\n".join(p.read_text() for p in files if "_pb2" not in p.name)


def _exists(path: str) -> bool:
    path = path.rstrip("/")
    candidates = [path, path + ".py"]
    if path.startswith("popmq/"):  # the installed name of broker/ and proxy/
        candidates += [path[len("popmq/") :], path[len("popmq/") :] + ".py"]
    return any((ROOT / c).exists() for c in candidates)


def test_every_path_it_names_exists() -> None:
    named = set(PATH.findall(DOC))
    assert len(named) > 40
    assert sorted(p for p in named if not _exists(p)) == []


def test_every_file_it_names_exists() -> None:
    here = {
        p.name
        for top in (*TOPS, ".")
        for p in (ROOT / top).glob("**/*.py" if top != "." else "*.py")
    }
    assert sorted(n for n in set(FILE.findall(DOC)) if n not in here) == []


def test_every_class_and_method_it_names_exists() -> None:
    source = _sources()
    classes = set(re.findall(r"(?:class|message)\s+(\w+)", source))
    names = set(re.findall(r"\w+", source))  # a method, field or attribute of that name
    named = set(METHOD.findall(DOC)) - {("TaskGroup", "start")}  # AnyIO's, for comparison
    assert sorted(f"{c}.{m}" for c, m in named if c not in classes or m not in names) == []
