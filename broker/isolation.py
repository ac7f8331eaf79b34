"""Per-entry fault isolation for the broker's background loops (timer, revive, DLQ).

One entry that keeps failing (a destination that cannot exist, a write the store refuses) must
not hold up the entries due with it. Each failing entry is retried on its own with exponential
backoff; after ``max_attempts`` failures, or at once for an error that retrying cannot fix, the
loop parks it (dead-letters or quarantines it, visibly: a log line and a metric).

An entry is parked after ``max_attempts`` only if the loop handled some other entry since this
one first failed: when everything fails (the disk is full, the store is closing), the fault is
not the entry's, and parking would only move good data out of the way. Such entries stay where
they are and are retried at the longest backoff, counted and logged, until the store recovers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from popmq.broker.contract.errors import Code, RefusedError

K = TypeVar("K")

# Errors that are the entry's own fault: retrying gives the same answer.
PERMANENT_CODES = frozenset(
    {
        Code.BAD_REQUEST,
        Code.ILLEGAL_TOPIC,
        Code.ILLEGAL_CONSUMER_GROUP,
        Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
        Code.MESSAGE_BODY_TOO_LARGE,
        Code.PAYLOAD_TOO_LARGE,
    }
)


def is_permanent(exc: BaseException) -> bool:
    if isinstance(exc, RefusedError):
        return exc.code in PERMANENT_CODES
    return isinstance(exc, (ValueError, KeyError, TypeError))


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass
class FailureTracker(Generic[K]):
    """Failed attempts per entry, and the loop's totals (exported as metrics)."""

    max_attempts: int = 5
    base_backoff_ms: int = 1000
    max_backoff_ms: int = 60_000
    # entry -> (failed attempts, when it first failed)
    attempts: dict[K, tuple[int, int]] = field(default_factory=dict)
    failed_attempts: int = 0  # every failed try of any entry
    parked: int = 0  # entries dead-lettered or quarantined
    last_success_ms: int = -1  # when the loop last handled an entry

    def failed(self, key: K, exc: BaseException, now_ms: int) -> tuple[bool, int]:
        """Record a failure: (park it now?, backoff ms before the next try)."""
        self.failed_attempts += 1
        count, first_ms = self.attempts.get(key, (0, now_ms))
        count += 1
        self.attempts[key] = (count, first_ms)
        if is_permanent(exc):
            return True, self.max_backoff_ms
        if count >= self.max_attempts:
            return self.last_success_ms >= first_ms, self.max_backoff_ms
        return False, min(self.base_backoff_ms * 2 ** (count - 1), self.max_backoff_ms)

    def succeeded(self, key: K, now_ms: int) -> None:
        self.attempts.pop(key, None)
        self.last_success_ms = max(self.last_success_ms, now_ms)

    def parked_one(self, key: K) -> None:
        self.attempts.pop(key, None)
        self.parked += 1
