"""Credentials and TLS for popmq's own client against a secured proxy (docs/security.md):
the same MQv2-HMAC-SHA1 signature the official clients send, TLS trusting a given CA (or the
system's roots), and a client certificate for proxies that verify one (mTLS,
``proxy.tls.client_ca``)."""

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
    cert_file: Path | None = None  # our client certificate (PEM), for mTLS proxies
    key_file: Path | None = None  # its private key (PEM)

    def __post_init__(self) -> None:
        if bool(self.access_key) != bool(self.secret_key):
            raise ValueError("give both an access key and a secret key, or neither")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("give both a client certificate and its key, or neither")

    def __repr__(self) -> str:  # never the secret key
        mtls = ", client_cert=True" if self.cert_file else ""
        return f"ClientSecurity(access_key={self.access_key!r}, tls={self.tls}{mtls})"

    def signature(self) -> tuple[tuple[str, str], ...]:
        """Signed headers for one call (fresh date-time), or none without keys."""
        if not self.access_key:
            return ()
        return tuple(signed_metadata(self.access_key, self.secret_key))

    def credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials (a CA file or a client certificate imply TLS), or None: plaintext."""
        if not (self.tls or self.ca_file or self.cert_file):
            return None
        return channel_credentials(self.ca_file, self.cert_file, self.key_file)
