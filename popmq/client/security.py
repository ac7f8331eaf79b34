"""Credentials and TLS for popmq's own client against a secured proxy (docs/security.md):
the same MQv2-HMAC-SHA1 signature the official clients send, and TLS trusting a given CA (or
the system's roots)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from popmq.security.signature import signed_metadata
from popmq.security.tls import channel_credentials


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    access_key: str = ""
    secret_key: str = ""
    tls: bool = False
    ca_file: Path | None = None  # None with tls: the system's roots

    def __post_init__(self) -> None:
        if bool(self.access_key) != bool(self.secret_key):
            raise ValueError("give both an access key and a secret key, or neither")

    def __repr__(self) -> str:  # never the secret key
        return f"ClientSecurity(access_key={self.access_key!r}, tls={self.tls})"

    def signature(self) -> tuple[tuple[str, str], ...]:
        """Signed headers for one call (fresh date-time), or none without keys."""
        if not self.access_key:
            return ()
        return tuple(signed_metadata(self.access_key, self.secret_key))

    def credentials(self) -> grpc.ChannelCredentials | None:
        return channel_credentials(self.ca_file) if self.tls or self.ca_file else None
