"""How often signing in may fail (the /login form, and HTTP Basic on the API and pages): a token
bucket per client address and one per access key.

A wrong key pair costs its address and the access key it named one token each; with either
bucket empty the form answers 429 with Retry-After, before the proxy is asked. So one address
cannot guess secrets quickly, and many addresses cannot guess one user's secret quickly. A
successful sign-in costs nothing.

The table is bounded (MAX_BUCKETS), but forgetting must never free one it holds back: with an LRU
anyone could fail from fresh addresses (or as fresh keys) until a drained bucket, say the
admin key's, was pushed out and came back full. So room is made only from buckets that limit
nobody: one of the longest idle that has refilled (the same as a new one), else the
longest-idle one that still has a token. A table of nothing but empty buckets takes no new
entry: a try that would need one waits (429) until one of them earns a token back.

A per-key bucket is also a way to lock a user out: anyone may fail as ``ops``. So an address
that has signed in as a key (a bounded table, MAX_BUCKETS pairs) is held by its own address
bucket only, not by that key's: a stranger's guesses keep new places waiting, never the
admin's usual one. An access key is kept as a digest (its bucket must not keep a form field of
any size).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

BURST = 10  # failed sign-ins allowed at once
REFILL_PER_S = 1 / 6  # then one every 6 s (10 a minute)
MAX_BUCKETS = 10_000
_LOOK_FOR_FULL = 64  # making room looks this far for a refilled bucket before taking another


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class LoginLimiter:
    burst: float = BURST
    refill_per_s: float = REFILL_PER_S
    clock: Callable[[], float] = time.monotonic
    _buckets: OrderedDict[str, _Bucket] = field(default_factory=OrderedDict)
    _signed_in: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict)

    def retry_after(self, address: str, access_key: str) -> int:
        """Seconds to wait before the next try (0: go ahead)."""
        keys = self._keys(address, access_key)
        if (address, _digest(access_key)) in self._signed_in:
            keys = keys[:1]  # only the address's own bucket (see the module's docstring)
        waits = [self._wait(key) for key in keys]
        missing = sum(1 for key in keys if key not in self._buckets)
        if missing and not self._room_for(missing):
            waits.append(self._soonest_token())  # a failure here could not be counted
        return max(waits, default=0)

    def succeeded(self, address: str, access_key: str) -> None:
        """``address`` signed in as ``access_key``: that key's bucket no longer holds it."""
        pair = (address, _digest(access_key))
        self._signed_in[pair] = None
        self._signed_in.move_to_end(pair)
        while len(self._signed_in) > MAX_BUCKETS:
            self._signed_in.popitem(last=False)

    def failed(self, address: str, access_key: str) -> None:
        for key in self._keys(address, access_key):
            bucket = self._refilled(key)
            if bucket is not None:
                bucket.tokens = max(0.0, bucket.tokens - 1)

    @staticmethod
    def _keys(address: str, access_key: str) -> list[str]:
        keys = [f"addr:{address}"]
        if access_key:
            keys.append(f"key:{_digest(access_key)}")
        return keys

    def _wait(self, key: str) -> int:
        if key not in self._buckets:
            return 0
        bucket = self._refilled(key)
        if bucket is None or bucket.tokens >= 1:
            return 0
        return max(1, math.ceil((1 - bucket.tokens) / self.refill_per_s))

    def _tokens(self, bucket: _Bucket, now: float) -> float:
        return min(self.burst, bucket.tokens + (now - bucket.at) * self.refill_per_s)

    def _room_for(self, count: int) -> bool:
        """Could ``count`` new buckets be made (free places, or buckets that limit nobody)?"""
        free = MAX_BUCKETS - len(self._buckets)
        if free >= count:
            return True
        now = self.clock()
        spare = (b for b in self._buckets.values() if self._tokens(b, now) >= 1)
        return free + sum(1 for _ in itertools.islice(spare, count - free)) >= count

    def _soonest_token(self) -> int:
        now = self.clock()
        lacking = min((1 - self._tokens(b, now) for b in self._buckets.values()), default=0.0)
        return max(1, math.ceil(lacking / self.refill_per_s))

    def _make_room(self) -> bool:
        """Forget one bucket that limits nobody, if the table is full: a refilled one first
        (the same as a new one), else one with a token left; never an empty one."""
        if len(self._buckets) < MAX_BUCKETS:
            return True
        now = self.clock()
        spare = None
        for looked, (key, bucket) in enumerate(self._buckets.items()):  # longest idle first
            if spare is not None and looked >= _LOOK_FOR_FULL:
                break  # a bucket with a token will do: no whole-table scan per failure
            tokens = self._tokens(bucket, now)
            if tokens >= self.burst:
                spare = key
                break
            if spare is None and tokens >= 1:
                spare = key
        if spare is None:
            return False
        del self._buckets[spare]
        return True

    def _refilled(self, key: str) -> _Bucket | None:
        """``key``'s bucket, refilled to now; a new one if there is room (None if not)."""
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if not self._make_room():
                return None  # retry_after refused such tries; one that raced it goes uncounted
            bucket = _Bucket(self.burst, now)
            self._buckets[key] = bucket
        else:
            bucket.tokens = self._tokens(bucket, now)
            bucket.at = now
            self._buckets.move_to_end(key)
        return bucket


def _digest(access_key: str) -> str:
    return hashlib.sha256(access_key.encode(errors="surrogatepass")).hexdigest()
