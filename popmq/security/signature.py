"""The RocketMQ 5 request signature, as the official clients send it.

Every call carries ``x-mq-date-time: YYYYMMDDTHHMMSSZ`` and ``authorization: MQv2-HMAC-SHA1
Credential=<AK>, SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1(SK, date-time)>``. The
Python client 5.1.2 writes its *local* time with a ``Z`` suffix and lower-case hex; the Node
client 1.0.8 writes UTC and upper-case hex. So the hex is compared case-insensitively and the
date-time is accepted when it lies within the skew of the current UTC time, or of the current
time in this server's local zone (a client in the server's zone), or, with ``any_timezone``,
within the skew of any whole quarter-hour zone offset from UTC-12 to UTC+14.

Only the date-time is signed (not the request): a captured header is a bearer credential until
it falls out of the window, which is why the window is short and TLS is what keeps it secret.
"""

from __future__ import annotations

import hmac
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from hashlib import sha1

from popmq.security.errors import BAD_CREDENTIALS, AccessDenied, unauthorized

DATE_HEADER = "x-mq-date-time"
AUTH_HEADER = "authorization"
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"

_AUTH = re.compile(
    r"^MQv2-HMAC-SHA1\s+Credential=([^,\s]+),\s*SignedHeaders=([^,\s]+),\s*Signature=([0-9A-Fa-f]+)$"
)
_QUARTER_HOUR_S = 15 * 60
# Signs for access keys that do not exist (see refuse_unknown): random, never a real secret.
_DECOY_SECRET = secrets.token_hex(20)
# Zone offsets in use on Earth: UTC-12:00 .. UTC+14:00.
_MIN_OFFSET_S = -12 * 3600
_MAX_OFFSET_S = 14 * 3600


@dataclass(frozen=True, slots=True)
class SignedRequest:
    access_key: str
    signature: str  # hex, as sent
    date_time: str


def sign(secret_key: str, date_time: str) -> str:
    """Lower-case hex HMAC-SHA1 of the date-time under the secret key (the clients' form).
    One HMAC per call, known key or decoy alike (no cached answers: an answer cached for a key
    in use would tell it from an unknown one by time); the keyed state is made once per key."""
    keyed = _keyed(secret_key).copy()
    keyed.update(date_time.encode())
    return keyed.hexdigest()


@lru_cache(maxsize=64)  # the ACL's users' keys and the decoy; a copy skips the key set-up
def _keyed(secret_key: str) -> hmac.HMAC:
    return hmac.new(secret_key.encode(), digestmod=sha1)


@lru_cache(maxsize=256)  # the same header on every call of a client's second
def _auth_parts(header: str) -> tuple[str, str, str] | None:
    match = _AUTH.match(header)
    return None if match is None else (match[1], match[2], match[3])


def signed_metadata(
    access_key: str, secret_key: str, now: float | None = None
) -> list[tuple[str, str]]:
    """The two headers a popmq tool (e.g. `popmq admin`) sends, in UTC."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime(DATE_FORMAT)
    auth = (
        f"{ALGORITHM} Credential={access_key}, SignedHeaders={DATE_HEADER}, "
        f"Signature={sign(secret_key, stamp)}"
    )
    return [(DATE_HEADER, stamp), (AUTH_HEADER, auth)]


def parse(headers: Mapping[str, str]) -> SignedRequest:
    """The signed request in a call's metadata; UNAUTHORIZED when missing or malformed."""
    header = headers.get(AUTH_HEADER, "").strip()
    if not header:
        raise unauthorized(
            "no credentials: this server requires an access key and signature", reason="missing"
        )
    parts = _auth_parts(header)
    if parts is None:
        raise unauthorized(
            f"malformed authorization header: expected {ALGORITHM} Credential=...",
            reason="malformed",
        )
    access_key, signed_headers, signature = parts
    if signed_headers.lower() != DATE_HEADER:
        raise unauthorized(f"SignedHeaders must be {DATE_HEADER}", reason="malformed")
    date_time = headers.get(DATE_HEADER, "")
    if not date_time:
        raise unauthorized(f"the signed {DATE_HEADER} header is missing", reason="malformed")
    return SignedRequest(access_key, signature, date_time)


@lru_cache(maxsize=1024)  # one parse per distinct second, not per request
def _stamp_seconds(date_time: str) -> float:
    try:
        return datetime.strptime(date_time, DATE_FORMAT).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise unauthorized(
            f"bad {DATE_HEADER} {date_time[:32]!r}: expected YYYYMMDDTHHMMSSZ", reason="malformed"
        ) from None


class SignatureVerifier:
    """Checks a signed request's freshness and HMAC against a secret key."""

    def __init__(
        self,
        skew_s: float,
        any_timezone: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._skew = skew_s
        self._any_timezone = any_timezone
        self._clock = clock

    @staticmethod
    def _local_offset_s(now: float) -> float:
        return float(time.localtime(now).tm_gmtoff)

    def fresh(self, date_time: str) -> bool:
        """Is the date-time within the skew of now (UTC, server-local, or any zone)?"""
        now = self._clock()
        delta = _stamp_seconds(date_time) - now  # the zone offset a local-time stamp carries
        if abs(delta) <= self._skew or abs(delta - self._local_offset_s(now)) <= self._skew:
            return True
        if not self._any_timezone:
            return False
        if not _MIN_OFFSET_S - self._skew <= delta <= _MAX_OFFSET_S + self._skew:
            return False
        nearest_zone = round(delta / _QUARTER_HOUR_S) * _QUARTER_HOUR_S
        return abs(delta - nearest_zone) <= self._skew

    def verify(self, request: SignedRequest, secret_key: str) -> None:
        """UNAUTHORIZED unless the signature matches and the date-time is fresh. The signature
        is checked first: only who holds the secret learns anything about the date-time."""
        expected = sign(secret_key, request.date_time)
        if not hmac.compare_digest(expected, request.signature.lower()):
            raise unauthorized(
                BAD_CREDENTIALS,
                detail="signature does not match (wrong secret key?)",
                reason="bad_signature",
            )
        if not self.fresh(request.date_time):
            raise unauthorized(
                f"{DATE_HEADER} {request.date_time} is outside the allowed clock skew "
                f"of {self._skew:.0f} s",
                reason="clock_skew",
            )

    def refuse_unknown(self, request: SignedRequest) -> AccessDenied:
        """The refusal of an unknown access key, after the same HMAC and comparison a known key
        costs (under a random key of this process): neither the answer nor its time tells an
        unknown key from a wrong secret."""
        hmac.compare_digest(sign(_DECOY_SECRET, request.date_time), request.signature.lower())
        return unauthorized(
            BAD_CREDENTIALS,
            detail=f"unknown access key {request.access_key[:64]!r}",
            reason="unknown_key",
        )


__all__ = ["AccessDenied", "SignatureVerifier", "SignedRequest", "parse", "sign", "signed_metadata"]
