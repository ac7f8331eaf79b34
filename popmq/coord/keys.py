"""Where a broker group lives in the coordination store, and what its keys hold.

Under ``PREFIX`` (default ``/popmq/``), per group ``G``:

- ``groups/G/members/NODE``: ``{"name", "address", "data"}`` ("data": whether its copy holds
  any data, for an unclean election), bound to the node's lease (present
  while the node is alive);
- ``groups/G/leader``: ``{"name", "address"}`` of the leader, bound to its lease. Its
  ``create_revision`` is the group's **epoch** (the fencing token; it only grows);
- ``groups/G/in_sync``: ``{"members": [NODE, ...]}``, the nodes allowed to become leader;
  changed only by a transaction that compares the leader key's create_revision with the
  writer's epoch (a deposed leader's change fails);
- ``groups/G/drain``: present while an operator drains the group (no new sends);
- ``groups/G/lag/NODE``: what replication reports of a follower (optional; bound to a lease).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DEFAULT_PREFIX = "/popmq/"


@dataclass(frozen=True, slots=True)
class GroupKeys:
    prefix: str
    group: str

    @property
    def root(self) -> bytes:
        return f"{self.prefix}groups/{self.group}/".encode()

    @property
    def leader(self) -> bytes:
        return self.root + b"leader"

    @property
    def in_sync(self) -> bytes:
        return self.root + b"in_sync"

    @property
    def drain(self) -> bytes:
        return self.root + b"drain"

    def member(self, node: str) -> bytes:
        return self.root + b"members/" + node.encode()

    def lag(self, node: str) -> bytes:
        return self.root + b"lag/" + node.encode()


def groups_prefix(prefix: str) -> bytes:
    return f"{prefix}groups/".encode()


def split_key(prefix: str, key: bytes) -> tuple[str, str] | None:
    """(group, rest) of a key under ``groups_prefix(prefix)``, else None."""
    base = groups_prefix(prefix)
    if not key.startswith(base):
        return None
    group, sep, rest = key[len(base) :].decode(errors="replace").partition("/")
    return (group, rest) if sep and group else None


def encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def decode(raw: bytes) -> dict[str, Any]:
    """A key's JSON object; {} for anything else (a foreign or damaged value is ignored)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
