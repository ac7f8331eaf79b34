"""EtcdStore: CoordStore over etcd's v3 JSON gateway (POST /v3/...), as Patroni does.

No etcd client library fits popmq's protobuf (aetcd pins protobuf<7; etcd3 is unmaintained),
and the gateway needs none: JSON over HTTP with base64 keys and values, int64 fields as
strings. Endpoints are tried in turn; the one that answered is used first next time. Each
request has a deadline (``timeout_s``) so a dead endpoint costs at most that.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from popmq.coord.store import (
    Compare,
    CoordUnavailableError,
    Delete,
    KeyValue,
    LeaseLostError,
    Put,
    TxnResult,
    WatchEvent,
)

log = logging.getLogger(__name__)
# httpx logs every request at INFO: a keepalive each second would flood the broker's log.
logging.getLogger("httpx").setLevel(logging.WARNING)

REQUEST_TIMEOUT_S = 2.0
_TARGETS = {"create": "CREATE", "mod": "MOD", "value": "VALUE"}
_RESULTS = {"==": "EQUAL", "!=": "NOT_EQUAL", ">": "GREATER", "<": "LESS"}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key after every key starting with ``prefix`` (etcd's range_end)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=_unb64(raw.get("key")),
        value=_unb64(raw.get("value")),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
        lease=int(raw.get("lease", 0)),
    )


def _op(op: Put | Delete) -> dict[str, Any]:
    if isinstance(op, Put):
        put: dict[str, Any] = {"key": _b64(op.key), "value": _b64(op.value)}
        if op.lease:
            put["lease"] = str(op.lease)
        return {"request_put": put}
    return {"request_delete_range": {"key": _b64(op.key)}}


def _compare(c: Compare) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(c.key), "target": _TARGETS[c.target],
                            "result": _RESULTS[c.op]}  # fmt: skip
    if c.target == "value":
        assert isinstance(c.value, bytes)
        body["value"] = _b64(c.value)
    else:
        body[f"{c.target}_revision"] = str(c.value)
    return body


def _granted(lease: int, answer: dict[str, Any]) -> float:
    ttl = int(answer.get("result", {}).get("TTL", 0))
    if ttl <= 0:  # the gateway answers an expired lease with no TTL
        raise LeaseLostError(f"lease {lease:x} expired")
    return float(ttl)


class EtcdStore:
    """CoordStore on one etcd cluster, given its client URLs (http://host:port)."""

    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint URL")
        self._endpoints = [url.rstrip("/") for url in endpoints]
        self._timeout_s = timeout_s
        self._client = httpx.AsyncClient(timeout=timeout_s)
        # Used by keepalive_blocking only, from the one thread that sends a lease's
        # keepalives (popmq.coord.group): made there, at its first keepalive.
        self._blocking: httpx.Client | None = None

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    async def aclose(self) -> None:
        await self._client.aclose()
        if self._blocking is not None:
            self._blocking.close()

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        failures: list[str] = []
        for endpoint in list(self._endpoints):
            try:
                response = await self._client.post(endpoint + path, json=body)
            except httpx.HTTPError as exc:
                failures.append(f"{endpoint}: {type(exc).__name__} {exc}")
                self._demote(endpoint)
                continue
            if (answer := self._answer(endpoint, response, failures)) is not None:
                return answer
        raise CoordUnavailableError(f"etcd did not answer {path}: " + "; ".join(failures))

    def _post_blocking(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """``_post`` for a thread that is not the event loop's (it blocks that thread)."""
        if self._blocking is None:
            self._blocking = httpx.Client(timeout=self._timeout_s)
        failures: list[str] = []
        for endpoint in list(self._endpoints):
            try:
                response = self._blocking.post(endpoint + path, json=body)
            except httpx.HTTPError as exc:
                failures.append(f"{endpoint}: {type(exc).__name__} {exc}")
                self._demote(endpoint)
                continue
            if (answer := self._answer(endpoint, response, failures)) is not None:
                return answer
        raise CoordUnavailableError(f"etcd did not answer {path}: " + "; ".join(failures))

    def _answer(
        self, endpoint: str, response: httpx.Response, failures: list[str]
    ) -> dict[str, Any] | None:
        """The answer of a 200 without error; else None (noted in ``failures``), or
        LeaseLostError."""
        answer: dict[str, Any] = response.json()
        if response.status_code == 200 and "error" not in answer:
            return answer
        message = str(answer.get("message") or answer.get("error") or response.text)
        if "lease not found" in message:
            raise LeaseLostError(message)
        # No leader / no quorum here; another member may still have one.
        failures.append(f"{endpoint}: HTTP {response.status_code} {message}")
        self._demote(endpoint)
        return None

    def _demote(self, endpoint: str) -> None:
        if len(self._endpoints) > 1 and self._endpoints[0] == endpoint:
            self._endpoints.append(self._endpoints.pop(0))

    async def grant(self, ttl_s: int) -> int:
        answer = await self._post("/v3/lease/grant", {"TTL": str(ttl_s)})
        return int(answer["ID"])

    async def keepalive(self, lease: int) -> float:
        return _granted(lease, await self._post("/v3/lease/keepalive", {"ID": str(lease)}))

    def keepalive_blocking(self, lease: int) -> float:
        return _granted(lease, self._post_blocking("/v3/lease/keepalive", {"ID": str(lease)}))

    async def revoke(self, lease: int) -> None:
        try:
            await self._post("/v3/lease/revoke", {"ID": str(lease)})
        except LeaseLostError:
            pass

    async def get(self, key: bytes) -> KeyValue | None:
        answer = await self._post("/v3/kv/range", {"key": _b64(key)})
        kvs = answer.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: bytes) -> tuple[list[KeyValue], int]:
        body = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
        answer = await self._post("/v3/kv/range", body)
        revision = int(answer["header"]["revision"])
        return [_kv(raw) for raw in answer.get("kvs") or []], revision

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        body = _op(Put(key, value, lease))["request_put"]
        answer = await self._post("/v3/kv/put", body)
        return int(answer["header"]["revision"])

    async def delete(self, key: bytes) -> None:
        await self._post("/v3/kv/deleterange", {"key": _b64(key)})

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> TxnResult:
        body = {
            "compare": [_compare(c) for c in compare],
            "success": [_op(op) for op in success],
            "failure": [_op(op) for op in failure],
        }
        answer = await self._post("/v3/kv/txn", body)
        return TxnResult(bool(answer.get("succeeded", False)), int(answer["header"]["revision"]))

    async def watch_prefix(self, prefix: bytes, start_revision: int) -> AsyncIterator[WatchEvent]:
        request = {
            "create_request": {
                "key": _b64(prefix),
                "range_end": _b64(prefix_end(prefix)),
                "start_revision": str(start_revision),
            }
        }
        endpoint = self._endpoints[0]
        # No read deadline: a watch is quiet while nothing changes. Connect and write have one.
        timeout = httpx.Timeout(self._timeout_s, read=None)
        try:
            async with self._client.stream(
                "POST", endpoint + "/v3/watch", json=request, timeout=timeout
            ) as response:
                if response.status_code != 200:
                    raise CoordUnavailableError(f"etcd watch: HTTP {response.status_code}")
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    result = json.loads(line).get("result", {})
                    if result.get("canceled") or result.get("compact_revision"):
                        raise CoordUnavailableError(f"etcd ended the watch: {result}")
                    for event in result.get("events") or []:
                        kv = _kv(event.get("kv", {}))
                        if event.get("type") == "DELETE":
                            yield WatchEvent("delete", kv)
                        else:
                            yield WatchEvent("put", kv)
        except httpx.HTTPError as exc:
            self._demote(endpoint)
            raise CoordUnavailableError(f"etcd watch on {endpoint} broke: {exc}") from exc
        self._demote(endpoint)
        raise CoordUnavailableError(f"etcd watch on {endpoint} ended")
