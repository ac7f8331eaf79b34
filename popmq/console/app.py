"""The console's Starlette application: pages, the JSON API and the static assets."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from popmq.console import api, pages
from popmq.console.state import ConsoleState

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


def build_app(state: ConsoleState) -> Starlette:
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
