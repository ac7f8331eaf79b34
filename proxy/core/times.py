"""Reading a client's times (protobuf Timestamps and Durations: seconds plus nanos): refused
with a RocketMQ code and a helpful message when invalid, never normalised, never a ValueError.

The core reads them through the ``SecondsNanos`` shape, so it needs no protobuf import: the
gRPC edge hands the messages' own Timestamp and Duration objects through unchanged.

One leniency: a Timestamp whose ``seconds`` lies beyond the Timestamp range (after year 9999)
but would be a valid time in milliseconds is read as milliseconds. The official Python client
5.1.2 copies ``Message.delivery_timestamp`` (milliseconds, says its docstring) into
``Timestamp.seconds`` unchanged; no real time in seconds is that large, so the reading is
unambiguous.
"""

from __future__ import annotations

from typing import Protocol

from popmq.broker.contract.errors import Code, RefusedError

# Timestamp's valid range (0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z), as protobuf defines it.
TIMESTAMP_MIN_S = -62_135_596_800
TIMESTAMP_MAX_S = 253_402_300_799
# Duration's valid range: about +-10,000 years.
DURATION_MAX_S = 315_576_000_000
_NANOS = 1_000_000_000


class SecondsNanos(Protocol):
    """A time as protobuf spells it (google.protobuf.Timestamp and Duration both fit)."""

    @property
    def seconds(self) -> int: ...

    @property
    def nanos(self) -> int: ...


def timestamp_ms(value: SecondsNanos, code: Code, what: str) -> int:
    """Milliseconds since the epoch of a client's Timestamp; ``code`` if it is invalid."""
    seconds, nanos = value.seconds, value.nanos
    if not 0 <= nanos < _NANOS:
        raise RefusedError(code, f"{what} has nanos {nanos}, outside [0, 999999999]")
    if TIMESTAMP_MIN_S <= seconds <= TIMESTAMP_MAX_S:
        return seconds * 1000 + nanos // 1_000_000
    if TIMESTAMP_MAX_S < seconds <= TIMESTAMP_MAX_S * 1000 and nanos == 0:
        return seconds  # milliseconds in the seconds field (see the module docstring)
    raise RefusedError(
        code,
        f"{what} {seconds} s is outside the Timestamp range (years 1 to 9999); send seconds "
        "since the epoch in Timestamp.seconds",
    )


def duration_ms(value: SecondsNanos, code: Code, what: str) -> int:
    """Milliseconds of a client's Duration (may be negative: callers check their bounds);
    ``code`` if it is not a valid Duration (out of range, or nanos with the wrong sign)."""
    seconds, nanos = value.seconds, value.nanos
    if not -DURATION_MAX_S <= seconds <= DURATION_MAX_S:
        raise RefusedError(code, f"{what} of {seconds} s is outside the Duration range")
    if not -_NANOS < nanos < _NANOS or (seconds > 0 > nanos) or (seconds < 0 < nanos):
        raise RefusedError(
            code,
            f"{what} has nanos {nanos}: they must be within +-999999999 and have the sign of "
            "the seconds",
        )
    return seconds * 1000 + int(nanos / 1_000_000)


def polling_duration_ms(value: SecondsNanos) -> int:
    return duration_ms(value, Code.ILLEGAL_POLLING_TIME, "long polling timeout")


def invisible_duration_ms(value: SecondsNanos) -> int:
    return duration_ms(value, Code.ILLEGAL_INVISIBLE_TIME, "invisible duration")
