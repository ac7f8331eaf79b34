"""An ACL for the benches, so the proxy is measured with authentication and authorization on.

Issue 18 measures the proxy with every feature on. The bench writes a users file with one
user allowed to publish on the bench topic and consume as the bench group, starts the proxy
with it, and its load generator signs every call as the official clients do
(popmq.security.signature: MQv2-HMAC-SHA1 over ``x-mq-date-time``). The floor server gets the
same signed headers (it ignores them), so both sides carry the same metadata.

The key pair is made per run (random, never a built-in secret) and the file is the owner's
only.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from popmq.security.signature import signed_metadata

ACCESS_KEY = "bench"


@dataclass
class BenchAcl:
    path: Path
    access_key: str
    secret_key: str = field(repr=False)
    _second: int = field(default=-1, repr=False)
    _headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The signed headers of a call made now. The signature covers only the date-time
        (to the second), so one signing per second serves every call of that second, as a
        client could cache it; the proxy still verifies each call."""
        now = time.time()
        second = int(now)
        if second != self._second:
            self._headers = tuple(signed_metadata(self.access_key, self.secret_key, now))
            self._second = second
        return self._headers


def write_bench_acl(directory: Path, topics: str | list[str], group: str) -> BenchAcl:
    """A users file in ``directory`` (0600) granting the bench user the topics and group."""
    names = [topics] if isinstance(topics, str) else list(topics)
    secret = secrets.token_hex(20)
    users = {
        "users": [
            {
                "access_key": ACCESS_KEY,
                "secret_key": secret,
                "allow": [
                    *({"publish": name} for name in names),
                    {"subscribe": {"group": group, "topics": names}},
                ],
            }
        ]
    }
    path = directory / "bench-acl.yaml"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        yaml.safe_dump(users, file)
    return BenchAcl(path, ACCESS_KEY, secret)
