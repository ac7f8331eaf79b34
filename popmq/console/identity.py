"""Who is asking, and what they may see.

Every request names a user by HTTP Basic (the JSON API) or by the session cookie the login form
sets (the pages). The console asks the proxy's WhoAmI with that user's own keys on each
request, so a wrong key, a removed user or a changed grant counts at once. Without an ACL on
the proxy everyone is an admin (local development).

An admin's calls go to the proxy signed with its own keys. A non-admin may not write (403); it
reads through the console's own admin keys (`popmq console --access-key`), and sees only the
topics and groups its grants reach. Without such keys a non-admin can only be told so.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import time
from dataclasses import dataclass, field

from popmq.console.admin_client import AdminClient, ConsoleError, Credentials
from popmq.pb.admin.v1 import admin_pb2 as a
from popmq.security.acl import Grant, Subscription, User

SESSION_TTL_S = 8 * 3600
MAX_SESSIONS = 10_000


@dataclass(frozen=True)
class Identity:
    acl: bool  # False: the proxy has no ACL, anyone may do anything
    admin: bool
    access_key: str
    credentials: Credentials | None  # signs this user's own calls
    user: User | None = None  # the grants, for a non-admin's reads

    def can_read_topic(self, topic: str) -> bool:
        return self.admin or (self.user is not None and self.user.can_read_topic(topic))

    def can_see_group(self, group: str) -> bool:
        return self.admin or (self.user is not None and self.user.can_subscribe(group))


def basic_credentials(header: str | None) -> Credentials | None:
    """The key pair of an `Authorization: Basic` header, or None (no such header or malformed)."""
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    access_key, sep, secret_key = decoded.partition(":")
    if not sep or not access_key or not secret_key:
        return None
    return Credentials(access_key, secret_key)


async def who_is(client: AdminClient, credentials: Credentials | None) -> Identity:
    """Ask the proxy; ConsoleError 401 when the proxy has an ACL and the keys do not sign in."""
    response = await client.call("WhoAmI", a.WhoAmIRequest(), credentials)
    if not response.acl:
        return Identity(acl=False, admin=True, access_key="", credentials=None)
    if credentials is None:  # the proxy answers UNAUTHORIZED first; kept for safety
        raise ConsoleError(401, "UNAUTHORIZED", "sign in with an access key and secret key")
    grants = tuple(
        Grant(publish=g.publish, namespace=g.namespace or None)
        if g.publish
        else Grant(
            # any topic: `topics` left out (the model refuses an explicit None, a YAML typo)
            subscribe=Subscription(group=g.subscribe_group)
            if g.any_topic
            else Subscription(group=g.subscribe_group, topics=tuple(g.subscribe_topics)),
            namespace=g.namespace or None,
        )
        for g in response.grants
    )
    user = User(
        access_key=response.access_key,
        secret_key=credentials.secret_key,  # pydantic makes it a SecretStr
        admin=response.admin,
        allow=grants,
    )
    return Identity(
        acl=True,
        admin=response.admin,
        access_key=response.access_key,
        credentials=credentials,
        user=user,
    )


@dataclass
class Sessions:
    """Signed-in users, by a random session id (the signed cookie holds only that id; the
    keys stay in this process's memory and go with it)."""

    _by_id: dict[str, tuple[float, Credentials]] = field(default_factory=dict)

    def open(self, credentials: Credentials) -> str:
        self._expire()
        if len(self._by_id) >= MAX_SESSIONS:  # oldest out first
            oldest = min(self._by_id, key=lambda k: self._by_id[k][0])
            del self._by_id[oldest]
        session_id = secrets.token_urlsafe(32)
        self._by_id[session_id] = (time.monotonic(), credentials)
        return session_id

    def get(self, session_id: str | None) -> Credentials | None:
        if not session_id:
            return None
        entry = self._by_id.get(session_id)
        if entry is None or time.monotonic() - entry[0] > SESSION_TTL_S:
            self._by_id.pop(session_id, None)
            return None
        return entry[1]

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._by_id.pop(session_id, None)

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, (t, _) in self._by_id.items() if now - t > SESSION_TTL_S]:
            del self._by_id[key]
