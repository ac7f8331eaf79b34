"""The broker's receipt-handle keys: a small JSON keyring, private to one broker.

    {"active": "3f9c2a1b", "keys": [{"id": "3f9c2a1b", "secret": "<base64, 32 bytes>",
                                     "created": "2026-11-23T19:00:00Z"}, ...]}

New handles are sealed with the active key; every key in the file still opens handles, so a
rotation (``popmq handle-keys rotate``) keeps handles already given out valid until the old key
is retired (``popmq handle-keys retire ID``). The default file, ``<data_dir>/handle-keys.json``,
is made with one random key on first start (mode 0600). ``broker.handle_keys_file`` points at
another one, e.g. a mounted Kubernetes Secret; such a file is read, never written. A running
broker sees changes to the file within a second.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from popmq.broker.store import changes

from popmq.clock import SYSTEM, Clock
from popmq.config import BrokerConfig
from popmq.security.files import warn_if_exposed

log = logging.getLogger(__name__)

DEFAULT_NAME = "handle-keys.json"
KEY_BYTES = 32  # AES-256-GCM
_RELOAD_EVERY_S = 1.0


class KeyringError(ValueError):
    """The keyring file is missing, unreadable or malformed."""


@dataclass(frozen=True, slots=True)
class HandleKey:
    key_id: str
    secret: bytes
    created: str

    def to_json(self) -> dict[str, str]:
        return {
            "id": self.key_id,
            "secret": base64.b64encode(self.secret).decode(),
            "created": self.created,
        }


def new_key() -> HandleKey:
    return HandleKey(
        key_id=secrets.token_hex(4),
        secret=secrets.token_bytes(KEY_BYTES),
        created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def keyring_path(config: BrokerConfig) -> Path:
    return config.handle_keys_file or Path(config.data_dir) / DEFAULT_NAME


def read_keys(path: Path) -> tuple[str, list[HandleKey]]:
    """(active id, keys) of a keyring file."""
    try:
        data = json.loads(path.read_text())
        keys = [
            HandleKey(str(k["id"]), base64.b64decode(k["secret"], validate=True), str(k["created"]))
            for k in data["keys"]
        ]
        active = str(data["active"])
    except OSError as exc:
        raise KeyringError(f"cannot read the handle keyring {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise KeyringError(f"malformed handle keyring {path}: {exc!r}") from None
    ids = [k.key_id for k in keys]
    if active not in ids:
        raise KeyringError(f"handle keyring {path}: the active key {active!r} is not in it")
    if len(set(ids)) != len(ids):
        raise KeyringError(f"handle keyring {path}: a key id appears twice")
    for key in keys:
        if len(key.secret) != KEY_BYTES or not key.key_id.isalnum():
            raise KeyringError(f"handle keyring {path}: key {key.key_id!r} is not a 32-byte key")
    return active, keys


def write_keys(path: Path, active: str, keys: list[HandleKey]) -> None:
    """Replace the keyring atomically; readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"active": active, "keys": [k.to_json() for k in keys]}, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    changes.note(changes.ENTRIES)  # a replicated document (the default keyring) changed


def rotate(path: Path) -> HandleKey:
    """Add a new random key and make it the active one; older keys keep opening handles."""
    _, keys = read_keys(path)
    key = new_key()
    write_keys(path, key.key_id, [*keys, key])
    return key


def retire(path: Path, key_id: str) -> None:
    """Remove a key: handles sealed with it are refused from now on. Never the active key."""
    active, keys = read_keys(path)
    if key_id == active:
        raise KeyringError(f"{key_id!r} is the active key: rotate first, then retire it")
    if key_id not in {k.key_id for k in keys}:
        raise KeyringError(f"no key {key_id!r} in {path}")
    write_keys(path, active, [k for k in keys if k.key_id != key_id])


def _identity(path: Path) -> tuple[int, int, int]:
    """What tells a rewritten file apart: mtime, inode (os.replace makes a new one), size."""
    st = path.stat()
    return (st.st_mtime_ns, st.st_ino, st.st_size)


class HandleKeyring:
    """The keys of one broker, reloaded when the file changes."""

    def __init__(
        self, path: Path | None, keys: list[HandleKey] | None = None, clock: Clock = SYSTEM
    ) -> None:
        """From a keyring file, or (path None) from keys held in memory only (tests)."""
        self.path = path
        self._time = clock  # when to look at the file again
        self._mtime: tuple[int, int, int] | None = None
        self._checked = 0.0
        self.active_id = ""
        self._ciphers: dict[str, AESGCM] = {}
        self.reload_failures = 0  # changed files that could not be loaded (metric)
        if path is not None:
            self._load()
        else:
            self._use(keys or [new_key()])

    def _use(self, keys: list[HandleKey], active: str | None = None) -> None:
        self._ciphers = {k.key_id: AESGCM(k.secret) for k in keys}
        self.active_id = active or keys[-1].key_id

    @classmethod
    def open(cls, config: BrokerConfig, clock: Clock = SYSTEM) -> HandleKeyring:
        """The broker's keyring; the default file is created with a random key if missing."""
        path = keyring_path(config)
        if config.handle_keys_file is None and not path.exists():
            key = new_key()
            write_keys(path, key.key_id, [key])
            log.info("broker %s: new receipt-handle key %s in %s", config.name, key.key_id, path)
        warn_if_exposed(path, "receipt-handle keys file")
        return cls(path, clock=clock)

    def _load(self) -> None:
        assert self.path is not None
        active, keys = read_keys(self.path)
        self._use(keys, active)
        try:
            self._mtime = _identity(self.path)
        except OSError:
            self._mtime = None

    def refresh(self) -> None:
        """Pick up a rotation at most once a second; a bad new file keeps the old keys."""
        now = self._time.monotonic()
        if self.path is None or now - self._checked < _RELOAD_EVERY_S:
            return
        self._checked = now
        try:
            mtime = _identity(self.path)
        except OSError:
            return
        if mtime == self._mtime:
            return
        # Written by another process (``popmq handle-keys rotate``): followers must get the
        # file before a handle sealed with a new key is answered (changes.py).
        changes.note(changes.ENTRIES)
        try:
            self._load()
            log.info("receipt-handle keys reloaded from %s (active %s)", self.path, self.active_id)
        except KeyringError as exc:
            self.reload_failures += 1
            log.error("keeping the current receipt-handle keys: %s", exc)
            self._mtime = mtime

    def active(self) -> tuple[str, AESGCM]:
        self.refresh()
        return self.active_id, self._ciphers[self.active_id]

    def cipher(self, key_id: str) -> AESGCM | None:
        self.refresh()
        return self._ciphers.get(key_id)
