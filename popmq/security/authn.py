"""Who is calling: a signed request checked against the ACL's users."""

from __future__ import annotations

from collections.abc import Mapping

from popmq.security import signature
from popmq.security.acl import Acl, AclFile, User


class Authenticator:
    """Checks requests against an ACL, fixed or read from a file that may change."""

    def __init__(self, acl: Acl | AclFile, verifier: signature.SignatureVerifier) -> None:
        self._acl = acl
        self._verifier = verifier

    @property
    def acl(self) -> Acl:
        return self._acl.current() if isinstance(self._acl, AclFile) else self._acl

    def authenticate(self, headers: Mapping[str, str]) -> User:
        """The calling user; UNAUTHORIZED if unknown, unsigned, badly signed or stale. An
        unknown key and a wrong signature get the same answer (BAD_CREDENTIALS)."""
        request = signature.parse(headers)
        user = self.acl.user(request.access_key)
        if user is None:
            raise self._verifier.refuse_unknown(request)
        self._verifier.verify(request, user.secret_key.get_secret_value())
        return user
