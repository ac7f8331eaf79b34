"""Small documents other broker services keep in the store (state/<name>.json): atomically
replaced, checksummed, with the previous copy kept (metafile.py)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.store import metafile
from popmq.broker.store.damage import MetadataFallback, StoreFaults

log = logging.getLogger(__name__)

_STATE_NAME = re.compile(r"^[A-Za-z0-9_%-][A-Za-z0-9_.%-]{0,199}$")


def state_path(data_dir: Path, name: str) -> Path:
    if not isinstance(name, str) or not _STATE_NAME.match(name):
        raise RefusedError(Code.BAD_REQUEST, f"illegal state document name {name!r}")
    return data_dir / "state" / f"{name}.json"


def load_state(data_dir: Path, name: str, faults: StoreFaults) -> Any | None:
    """A document saved by save_state, or None if there is none. A damaged one falls back
    to its previous copy (logged, in ``faults``); None (logged) if neither is intact."""
    path = state_path(data_dir, name)
    result = metafile.read(path)
    if result.fell_back and result.source is not metafile.Source.MISSING:
        log.error("store: state document %s is %s; %s", path.name, result.problem,
                  "using its previous copy" if result.body is not None
                  else "no intact previous copy: starting without it")  # fmt: skip
        action = "previous_copy" if result.body is not None else "reset"
        faults.metadata.append(MetadataFallback(f"state/{path.name}", action, result.problem))
    return result.body


def save_state(data_dir: Path, name: str, value: Any) -> None:
    """Atomically replace a document (metafile.write: checksum, previous copy kept);
    blocks for the fsync."""
    metafile.write(state_path(data_dir, name), value)
