"""CoordStore: the few operations popmq needs from a coordination store, and their values.

Kept small on purpose (etcd today; a Kubernetes Lease backend could implement the same shape,
minus fencing). Keys and values are bytes; revisions are the store's global counters, which
only grow: a key's ``create_revision`` is the epoch of whoever created it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from popmq.errors import Code, PopmqError


class CoordUnavailableError(PopmqError):
    """The coordination store did not answer (no endpoint reachable, or no quorum)."""

    code = Code.HA_NOT_AVAILABLE


class LeaseLostError(PopmqError):
    """A lease is gone (expired or revoked): whatever was bound to it is gone too."""

    code = Code.HA_NOT_AVAILABLE


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a transaction: ``target`` of ``key`` compared ``op`` with ``value``.

    For "create"/"mod" the value is a revision (0 means "the key does not exist"); for
    "value" it is the key's bytes."""

    key: bytes
    target: Literal["create", "mod", "value"]
    value: int | bytes
    op: Literal["==", "!=", ">", "<"] = "=="


@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: bytes


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the transaction (the new keys' create_revision)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: Literal["put", "delete"]
    kv: KeyValue  # for a delete: the key and the revision of the deletion, value empty


class CoordStore(Protocol):
    async def grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; its id."""

    async def keepalive(self, lease: int) -> float:
        """Renew the lease; the TTL granted from now, in seconds. LeaseLostError if gone."""

    def keepalive_blocking(self, lease: int) -> float:
        """``keepalive`` from a thread other than the event loop's, blocking it (a lease's
        keepalives go from a thread of their own: a busy event loop cannot delay them)."""

    async def revoke(self, lease: int) -> None:
        """End the lease now (its keys are deleted); a lease already gone is no error."""

    async def get(self, key: bytes) -> KeyValue | None: ...

    async def get_prefix(self, prefix: bytes) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` and the revision they were read at."""

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Write a key (bound to ``lease`` when not 0); the new revision."""

    async def delete(self, key: bytes) -> None: ...

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> TxnResult:
        """All of ``success`` if every comparison holds, else all of ``failure``: atomically."""

    def watch_prefix(self, prefix: bytes, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Changes under ``prefix`` from ``start_revision`` on, until the caller stops; raises
        CoordUnavailableError when the stream breaks (the caller re-reads and watches again)."""

    async def aclose(self) -> None: ...
