"""Opt-in study build: the per-message modules of `popmq serve` compiled with mypyc, in a tree
of their own (docs/benchmarks.md, "Compiled hot path, wave 12").

Nothing in `make install` or the package uses it, and it writes nothing next to the sources:
it lays the package out in DEST as it installs (scripts/layers_tree.py: hard links), compiles
HOT there with the mypyc that ships with the project's mypy, and leaves DEST ready to put first
on the path. Bench child processes inherit the environment, so

    python scripts/mypyc_hot.py build/mypyc
    cd "$(mktemp -d)" && PYTHONPATH=$REPO/build/mypyc $REPO/.venv/bin/popmq bench e2e ...

runs the bench with the compiled modules (the other modules are the same files, hard links).
Run it from outside the repository: `python -m` and `python -c` (the bench's children are
`python -m popmq ...`) put the current directory first on the path, and the repository's own
popmq/ would shadow the compiled tree. Takes 4-6 minutes on 2 loaded cores at
MYPYC_OPT_LEVEL 2 (one C file of about 14 MB); set MYPYC_OPT_LEVEL to change the level.

    python scripts/mypyc_hot.py [DEST] [MODULE.py ...]   (default: build/mypyc, HOT)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layers_tree import REPO, lay_out

# The modules a sent, received and acked message runs through (edge translators, core, the
# brokers' store and pop), that mypyc compiles. Left out and why: docs/benchmarks.md.
HOT = [
    "popmq/proxy/grpc/convert.py",
    "popmq/proxy/grpc/send.py",
    "popmq/proxy/grpc/handles.py",
    "popmq/proxy/grpc/receive.py",
    "popmq/proxy/grpc/status.py",
    "popmq/proxy/grpc/stall.py",
    "popmq/proxy/core/send.py",
    "popmq/proxy/core/receive.py",
    "popmq/proxy/core/handles.py",
    "popmq/proxy/core/validate.py",
    "popmq/proxy/core/times.py",
    "popmq/broker/store/framing.py",
    "popmq/broker/store/codec.py",
    "popmq/broker/store/commitlog.py",
    "popmq/broker/store/writer.py",
    "popmq/broker/store/queue_index.py",
    "popmq/broker/store/reader.py",
    "popmq/broker/store/message_store.py",
    "popmq/broker/pop/handle.py",
    "popmq/broker/pop/ledger.py",
    "popmq/broker/pop/engine.py",
    "popmq/broker/pop/queue_state.py",
    "popmq/broker/pop/handle_keys.py",
    "popmq/broker/core.py",
    "popmq/broker/names.py",
]


def build(dest: Path, modules: list[str]) -> None:
    lay_out(dest)
    shutil.copy2(REPO / "pyproject.toml", dest / "pyproject.toml")  # mypy's settings
    env = {**os.environ, "MYPYC_OPT_LEVEL": os.environ.get("MYPYC_OPT_LEVEL", "2")}
    mypyc = Path(sys.executable).with_name("mypyc")
    started = time.monotonic()
    subprocess.run(
        [str(mypyc), "--config-file", "pyproject.toml", *modules], cwd=dest, env=env, check=True
    )
    print(f"compiled {len(modules)} modules in {time.monotonic() - started:.0f} s: "
          f"PYTHONPATH={dest} to use them")  # fmt: skip


if __name__ == "__main__":
    args = sys.argv[1:]
    target = Path(args.pop(0)) if args and not args[0].endswith(".py") else REPO / "build" / "mypyc"
    build(target.resolve(), args or HOT)
