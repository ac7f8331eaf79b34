"""The on-disk format marker: ``DATA/FORMAT`` names the layout version of a data directory.

A store refuses to open a directory written by a newer, unknown format (rather than misread
and "repair" it), and writes the marker into a new directory, or into one written before the
marker existed (format 1 is that layout).
"""

from __future__ import annotations

import os
from pathlib import Path

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.store.framing import fsync_dir

MARKER = "FORMAT"
MAGIC = "popmq-store-format"
CURRENT_VERSION = 1


def marker_text(version: int = CURRENT_VERSION) -> str:
    return f"{MAGIC} {version}\n"


def read_version(data_dir: Path) -> int | None:
    """The format version of ``data_dir``, None when it has no marker; RefusedError when the
    marker is unreadable."""
    path = data_dir / MARKER
    try:
        text = path.read_text("ascii", errors="replace").strip()
    except FileNotFoundError:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] != MAGIC or not parts[1].isdigit():
        raise RefusedError(
            Code.INTERNAL_ERROR,
            f"{path} is damaged ({text[:40]!r}); if this is a popmq data directory of this "
            f"version, repair it with: echo '{marker_text().strip()}' > {path}",
        )
    return int(parts[1])


def check_and_mark(data_dir: Path) -> str:
    """Refuse an unknown future format; write the marker where it is missing. Returns
    "ok", "created" (a new directory) or "added" (data written before the marker existed)."""
    version = read_version(data_dir)
    if version is not None:
        if version > CURRENT_VERSION:
            raise RefusedError(
                Code.INTERNAL_ERROR,
                f"{data_dir} holds store format {version}, newer than this popmq understands "
                f"({CURRENT_VERSION}); run the popmq version that wrote it",
            )
        return "ok"
    had_data = any(
        (data_dir / name).exists() for name in ("commitlog", "index", "topics.log", "topics.json")
    )
    path = data_dir / MARKER
    tmp = path.with_name(MARKER + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(marker_text())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(data_dir)
    return "added" if had_data else "created"
