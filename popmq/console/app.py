"""The console's Starlette application: pages, the JSON API and the static assets."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from popmq.console import api, pages
from popmq.console.state import ConsoleState

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})

# Everything comes from this console: no CDN, no inline script, no framing.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)


async def _security_headers(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    response = await call_next(request)
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("Cache-Control", "no-store")
    return response


def cross_origin(request: Request) -> bool:
    """Whether a browser sent this request from another origin. Browsers name where a request
    comes from (Sec-Fetch-Site, Origin, else Referer); scripts (curl, httpx) name nothing and
    are not a browser tricked into posting. SameSite cookies do not cover this: with no ACL
    there is no cookie at all, another port of this host is the same site, and a browser also
    replays cached HTTP Basic keys on another site's form post."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return True
    source = request.headers.get("origin") or request.headers.get("referer")
    if source is None:
        return False
    return _netloc(source) != request.headers.get("host", "").lower()


def _netloc(url: str) -> str:
    """host:port of a URL, lower case ("" for what does not parse, e.g. an open bracket)."""
    try:
        return urlsplit(url).netloc.lower()
    except ValueError:
        return ""


async def _same_origin_writes(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    """A change (form post or API write) only from the console's own pages or from a script:
    another site's page cannot make a signed-in (or ACL-less) browser post here (CSRF)."""
    if request.method not in SAFE_METHODS and cross_origin(request):
        return PlainTextResponse(
            "403 FORBIDDEN: a change must come from this console's own pages", 403
        )
    return await call_next(request)


async def _loopback_host(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    """On a loopback address, only requests for a loopback name: another name that resolves
    here is DNS rebinding (a page of that name reading and driving an ACL-less console as if
    it were its own origin; the Origin check cannot tell, Origin and Host agree)."""
    try:
        name = urlsplit("//" + request.headers.get("host", "")).hostname or ""
    except ValueError:  # e.g. an open bracket
        name = ""
    if name not in LOOPBACK_NAMES:
        return PlainTextResponse(
            "403 FORBIDDEN: this console answers only at 127.0.0.1 or localhost", 403
        )
    return await call_next(request)


def build_app(state: ConsoleState, loopback: bool = False) -> Starlette:
    """``loopback``: the console listens on a loopback address (refuse other host names)."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await state.client.close()

    from starlette.middleware.base import BaseHTTPMiddleware

    app = Starlette(
        routes=[
            *pages.routes,
            *api.routes,
            Mount(
                "/static", StaticFiles(directory=Path(__file__).parent / "static"), name="static"
            ),
        ],
        middleware=[
            Middleware(BaseHTTPMiddleware, dispatch=_security_headers),
            Middleware(BaseHTTPMiddleware, dispatch=_same_origin_writes),
            *([Middleware(BaseHTTPMiddleware, dispatch=_loopback_host)] if loopback else []),
            # The cookie holds a random session id, signed with a key made for this process
            # (no built-in secret; sessions end when the console restarts). SameSite=Strict:
            # another site's form cannot post with it.
            Middleware(
                SessionMiddleware,
                secret_key=secrets.token_urlsafe(32),
                session_cookie="popmq_console",
                same_site="strict",
                max_age=8 * 3600,
            ),
        ],
        lifespan=lifespan,
    )
    app.state.console = state
    return app
