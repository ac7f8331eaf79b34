"""TLS credentials from PEM files (cert-manager or a Kubernetes Secret mounts them)."""

from __future__ import annotations

from pathlib import Path

import grpc

from popmq.security.files import warn_if_exposed


def _read(path: Path | str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the {what} {path}: {exc.strerror}") from None


def _read_key(path: Path | str, what: str) -> bytes:
    """A private key: read, and one WARNING if others may read it too (as for the ACL, the
    cluster token and the handle keys; whoever holds it can pose as this server)."""
    key = _read(path, what)
    warn_if_exposed(path, what)
    return key


def server_credentials(
    cert: Path | None, key: Path | None, client_ca: Path | None = None
) -> grpc.ServerCredentials | None:
    """Server TLS from cert and key files; with client_ca, clients must show a certificate it
    signed (mutual TLS). None when no certificate is configured (plaintext)."""
    if cert is None and key is None:
        if client_ca is not None:
            raise ValueError("a client CA (mutual TLS) needs a server certificate and key too")
        return None
    if cert is None or key is None:
        raise ValueError("TLS needs both a certificate and its private key")
    pair = [(_read_key(key, "TLS private key"), _read(cert, "TLS certificate"))]
    if client_ca is None:
        return grpc.ssl_server_credentials(pair)
    return grpc.ssl_server_credentials(
        pair, root_certificates=_read(client_ca, "client CA"), require_client_auth=True
    )


def channel_credentials(
    ca: Path | None, cert: Path | None = None, key: Path | None = None
) -> grpc.ChannelCredentials:
    """Client TLS: trust `ca` (None: the system roots); cert and key: our client certificate."""
    if (cert is None) != (key is None):
        raise ValueError("a client certificate needs its private key, and the other way round")
    return grpc.ssl_channel_credentials(
        root_certificates=None if ca is None else _read(ca, "CA"),
        private_key=None if key is None else _read_key(key, "client TLS key"),
        certificate_chain=None if cert is None else _read(cert, "client TLS certificate"),
    )
