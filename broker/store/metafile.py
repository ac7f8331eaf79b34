"""Small metadata documents that survive crashes and bit rot: checksummed, versioned, backed up.

A document is stored as one JSON envelope ``{"format": 1, "crc32": C, "body": B}`` where C is
the CRC-32 of B's canonical JSON text. ``write`` replaces the file atomically (temp file, fsync,
rename, fsync the directory) after keeping the previous good copy as ``<name>.prev`` (a hard
link: no copy of the data). ``read`` checks the envelope and falls back to the previous copy
when the current one is missing or damaged, and says which one it used, so the caller can log
and count the fallback. Plain JSON written by older versions (no envelope) is still read.

Any module that keeps a small document (topics, checkpoints, consumer offsets, the groups
registry) should use ``write``/``read`` instead of raw JSON, so damage is noticed, never
crashes the broker with a JSONDecodeError, and never goes unreported.
"""

from __future__ import annotations

import enum
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from popmq.broker.store.framing import fsync_dir

FORMAT_VERSION = 1
PREVIOUS_SUFFIX = ".prev"


class Source(enum.Enum):
    CURRENT = "current"
    PREVIOUS = "previous"  # the current copy was missing or damaged
    MISSING = "missing"  # neither copy exists
    DAMAGED = "damaged"  # copies exist, none is readable


@dataclass(slots=True)
class ReadResult:
    body: Any | None
    source: Source
    problem: str = ""  # what was wrong with the current copy (empty when it was fine)

    @property
    def fell_back(self) -> bool:
        return self.source is not Source.CURRENT


class MetaFileError(Exception):
    """A document that cannot be used: damaged, or written by a newer format."""


def _canonical(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def encode(body: Any) -> bytes:
    text = _canonical(body)
    return b'{"format":%d,"crc32":%d,"body":' % (FORMAT_VERSION, zlib.crc32(text)) + text + b"}"


_ENVELOPE_KEYS = (b'"format"', b'"crc32"', b'"body"')


def _looks_like_envelope(data: bytes) -> bool:
    """Two of the three keys present: an envelope (one flipped byte alters at most one key,
    so a damaged envelope is never mistaken for a legacy plain document)."""
    head = data[:64]
    return sum(key in head for key in _ENVELOPE_KEYS[:2]) + (_ENVELOPE_KEYS[2] in head) >= 2


def decode(data: bytes) -> Any:
    """The body of an envelope (or a legacy plain JSON document); MetaFileError if damaged."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MetaFileError(f"not valid JSON ({exc})") from None
    if not _looks_like_envelope(data):
        return doc  # written before checksums existed
    if not (isinstance(doc, dict) and set(doc) == {"format", "crc32", "body"}):
        raise MetaFileError("damaged envelope")
    version = doc["format"]
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise MetaFileError(f"format {version!r} is newer than this popmq ({FORMAT_VERSION})")
    if zlib.crc32(_canonical(doc["body"])) != doc["crc32"]:
        raise MetaFileError("checksum mismatch")
    return doc["body"]


def previous_path(path: Path) -> Path:
    return path.with_name(path.name + PREVIOUS_SUFFIX)


def write(path: Path, body: Any) -> None:
    """Atomically replace ``path`` by ``body``; the replaced version becomes ``<name>.prev``
    when it was intact; a first write also writes ``.prev`` (a separate copy), so every
    document has a backup from its first write on."""
    data = encode(body)
    tmp = path.with_name(path.name + ".tmp")
    _write_file(tmp, data)
    link = path.with_name(path.name + ".prev.tmp")
    link.unlink(missing_ok=True)
    if _is_intact(path):
        os.link(path, link)  # the replaced version (its own inode: never written again)
    else:  # a first write (or a damaged current copy): the backup is a copy of this version
        _write_file(link, data)
    os.replace(link, previous_path(path))
    os.replace(tmp, path)
    fsync_dir(path.parent)
    identity = _identity(path)
    if identity is not None:
        _written[path] = identity


def _write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


# (size, mtime_ns, inode) of each file as this process last wrote it: a file that still
# matches was intact when written, so frequent writers (the checkpoint every flush interval)
# do not re-read and re-check it each time.
_written: dict[Path, tuple[int, int, int]] = {}


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _is_intact(path: Path) -> bool:
    identity = _identity(path)
    if identity is None:
        return False
    if _written.get(path) == identity:
        return True
    try:
        decode(path.read_bytes())
    except (OSError, MetaFileError):
        return False
    return True


def read(path: Path) -> ReadResult:
    """The document at ``path``, falling back to its previous copy. Never raises for damage:
    the result's ``source`` says what happened (see Source)."""
    problem = ""
    try:
        return ReadResult(decode(path.read_bytes()), Source.CURRENT)
    except FileNotFoundError:
        problem = "missing"
    except (OSError, MetaFileError) as exc:
        problem = str(exc)
    try:
        body = decode(previous_path(path).read_bytes())
    except FileNotFoundError:
        return ReadResult(None, Source.MISSING if problem == "missing" else Source.DAMAGED, problem)
    except (OSError, MetaFileError):
        return ReadResult(None, Source.DAMAGED, problem)
    return ReadResult(body, Source.PREVIOUS, problem)


def inspect(path: Path) -> str:
    """One word for ``verify``: ok, missing, legacy (no checksum) or the damage found."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "missing"
    try:
        json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return "damaged: not valid JSON"
    if not _looks_like_envelope(data):
        return "legacy (no checksum)"
    try:
        decode(data)
    except MetaFileError as exc:
        return f"damaged: {exc}"
    return "ok"
