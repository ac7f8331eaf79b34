"""What the console keeps for its lifetime, and how a request becomes an Asker."""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import Request

from popmq.console.admin_client import AdminClient, AdminTarget, ConsoleError, Credentials
from popmq.console.client_address import Network, client_address
from popmq.console.identity import Sessions, basic_credentials, who_is
from popmq.console.login_limit import LoginLimiter
from popmq.console.views import Asker, Rates

SESSION_KEY = "sid"


@dataclass
class ConsoleState:
    target: AdminTarget
    reader: Credentials | None = None  # the console's own keys (popmq console --access-key)
    client: AdminClient = field(init=False)
    sessions: Sessions = field(default_factory=Sessions)
    rates: Rates = field(default_factory=Rates)
    logins: LoginLimiter = field(default_factory=LoginLimiter)
    # console.trusted_proxies: whose X-Forwarded-For names the client (client_address.py)
    trusted_proxies: tuple[Network, ...] = ()

    def __post_init__(self) -> None:
        self.client = AdminClient(self.target)

    def address_of(self, request: Request) -> str:
        """The client's address, for the failed-sign-in limit."""
        return client_address(request, self.trusted_proxies)

    def credentials_of(self, request: Request) -> tuple[bool, Credentials | None]:
        """(came by Basic?, the key pair): HTTP Basic first, then the session cookie."""
        basic = basic_credentials(request.headers.get("authorization"))
        if basic is not None:
            return True, basic
        return False, self.sessions.get(request.session.get(SESSION_KEY))

    async def asker(self, request: Request) -> Asker:
        """Who is asking (ConsoleError 401 if the proxy has an ACL and they do not sign in)."""
        by_basic, credentials = self.credentials_of(request)
        if not by_basic or credentials is None:
            identity = await who_is(self.client, credentials)
            return Asker(self.client, identity, self.reader)
        # HTTP Basic names a key pair on every request: limited like /login's form, or the
        # API would let a secret be guessed at the proxy's speed.
        address = self.address_of(request)
        wait = self.logins.retry_after(address, credentials.access_key)
        if wait:
            raise ConsoleError(
                429, "TOO_MANY_REQUESTS", f"too many failed sign-ins: try again in {wait} s",
                retry_after=wait,
            )  # fmt: skip
        try:
            identity = await who_is(self.client, credentials)
        except ConsoleError as exc:
            if exc.http_status in (401, 403):
                self.logins.failed(address, credentials.access_key)
            raise
        if identity.acl:  # as /login's form: a stranger's guesses no longer hold this address
            self.logins.succeeded(address, credentials.access_key)
        return Asker(self.client, identity, self.reader)


def state_of(request: Request) -> ConsoleState:
    state: ConsoleState = request.app.state.console
    return state
