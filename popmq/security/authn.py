"""Who is calling: a signed request checked against the ACL's users."""

from __future__ import annotations

from collections.abc import Mapping

from popmq.security import signature
from popmq.security.acl import Acl, User
from popmq.security.errors import unauthorized


class Authenticator:
    def __init__(self, acl: Acl, verifier: signature.SignatureVerifier) -> None:
        self.acl = acl
        self._verifier = verifier

    def authenticate(self, headers: Mapping[str, str]) -> User:
        """The calling user; UNAUTHORIZED if unknown, unsigned, badly signed or stale."""
        request = signature.parse(headers)
        user = self.acl.user(request.access_key)
        if user is None:
            raise unauthorized(f"unknown access key {request.access_key[:64]!r}")
        self._verifier.verify(request, user.secret_key.get_secret_value())
        return user
