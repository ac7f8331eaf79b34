"""The HTML pages, each at a stable path, rendered from the same views as the JSON API.

Forms post to the page's own path and redirect back (post/redirect/get), so the pages work
without JavaScript; static/console.js only refreshes live pages and asks before a resend.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from popmq.console import views
from popmq.console.admin_client import ConsoleError, Credentials
from popmq.console.charts import line_chart
from popmq.console.identity import who_is
from popmq.console.state import SESSION_KEY, state_of
from popmq.console.views import Asker

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
templates.env.globals["line_chart"] = line_chart
templates.env.filters["hexbody"] = lambda b64: views.render_body(_b64(b64), "hex")
templates.env.filters["jsonbody"] = lambda b64: views.render_body(_b64(b64), "json")
templates.env.filters["textbody"] = lambda b64: views.render_body(_b64(b64), "text")

NAV = (
    ("/cluster", "Cluster"),
    ("/topics", "Topics"),
    ("/groups", "Groups"),
    ("/messages", "Messages"),
    ("/dlq", "DLQ"),
    ("/clients", "Clients"),
    ("/longpoll", "Long polling"),
)


def _b64(text: str) -> bytes:
    import base64

    return base64.b64decode(text)


Page = Callable[[Asker, Request], Awaitable[tuple[str, dict[str, Any]]]]


def _render(
    request: Request, template: str, context: dict[str, Any], status: int = 200
) -> Response:
    context = {"nav": NAV, "path": request.url.path, **context}
    return templates.TemplateResponse(request, template, context, status_code=status)


def _login_redirect(request: Request) -> Response:
    return RedirectResponse(f"/login?{urlencode({'next': request.url.path})}", 303)


def page(handler: Page) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        ask: Asker | None = None
        try:
            ask = await state_of(request).asker(request)
            if request.method == "POST":
                target = await handler(ask, request)
                return RedirectResponse(target[0], 303)
            template, context = await handler(ask, request)
            return _render(request, template, {"me": ask.identity, **context})
        except ConsoleError as exc:
            if exc.http_status == 401:
                return _login_redirect(request)
            me = ask.identity if ask is not None else None
            response = _render(request, "error.html", {"me": me, "error": exc}, exc.http_status)
            if exc.retry_after is not None:
                response.headers["Retry-After"] = str(exc.retry_after)
            return response

    return run


def _back(path: str, **params: str) -> str:
    kept = {k: v for k, v in params.items() if v}
    return f"{path}?{urlencode(kept)}" if kept else path


# -- pages -------------------------------------------------------------------------------------


async def _cluster(ask: Asker, request: Request) -> tuple[str, dict[str, Any]]:
    return "cluster.html", {"data": await views.cluster(ask, state_of(request).rates)}


async def _topics(ask: Asker, request: Request) -> tuple[str, dict[str, Any]]:
    name = request.query_params.get("name", "")
    detail = await views.topic(ask, name) if name else None
    listing = await views.topics(ask)
    return "topics.html", {"data": listing, "detail": detail, "note": request.query_params}


async def _create_topic(ask: Asker, request: Request) -> tuple[str, dict[str, Any]]:
    form = await request.form()
    name = str(form.get("name", "")).strip()
    try:
        queues = int(str(form.get("queues", "8")))
    except ValueError:
        raise ConsoleError(400, "BAD_REQUEST", "queues must be a number") from None
    await views.create_topic(ask, name, views.int32("queues", queues))
    return _back("/topics", name=name, created=name), {}


async def _groups(ask: Asker, request: Request) -> tuple[str, dict[str, Any]]:
    name = request.query_params.get("name", "")
    detail = await views.group(ask, name) if name else None
    return "groups.html", {
        "data": await views.groups(ask),
        "detail": detail,
        "note": request.query_params,
    }


async def _reset(ask: Asker, request: Request) -> tuple[str, dict[str, Any]]:
    form = await request.form()
    group, topic = str(form.get("group", "")), str(form.get("topic", ""))
    to = str(form.get("to", "")) or str(form.get("time", ""))
    result = await views.reset_offset(ask, group, topic, to)
    moved = sum(1 for q in result["queues"] if q["old_offset"] != q["new_offset"])
    return _back("/groups", name=group, reset=f"{topic}: {moved} queues moved"), {}


async def _messages(ask: Asker, request: Request) -> tuple[str, dict[str, Any]]:
    q = request.query_params
    found = None
    if q.get("id") or q.get("key") or q.get("since") or q.get("until"):
        found = await views.find_messages(
            ask, topic=q.get("topic", ""), message_id=q.get("id", ""), key=q.get("key", ""),
            since=q.get("since", ""), until=q.get("until", ""),
        )  # fmt: skip
    form = q.get("format", "text")
    return "messages.html", {"found": found, "q": q, "format": form}


async def _send(ask: Asker, request: Request) -> tuple[str, dict[str, Any]]:
    form = await request.form()
    keys = [k.strip() for k in str(form.get("keys", "")).split(",") if k.strip()]
    sent = await views.send_message(
        ask, str(form.get("topic", "")), str(form.get("body", "")).encode(),
        str(form.get("tag", "")), keys,
    )  # fmt: skip
    return _back("/messages", id=sent["message_id"], topic=sent["topic"], sent="1"), {}


async def _dlq(ask: Asker, request: Request) -> tuple[str, dict[str, Any]]:
    group = request.query_params.get("group", "")
    listing = await views.dlq(ask, group) if group else None
    groups = await views.groups(ask)
    return "dlq.html", {"data": listing, "groups": groups, "note": request.query_params}


async def _resend(ask: Asker, request: Request) -> tuple[str, dict[str, Any]]:
    form = await request.form()
    group = str(form.get("group", ""))
    ids = [str(i) for i in form.getlist("id") if str(i)]
    result = await views.resend_dlq(ask, group, ids, form.get("all") == "1")
    return _back("/dlq", group=group, resent=str(len(result["resent"]))), {}


async def _clients(ask: Asker, request: Request) -> tuple[str, dict[str, Any]]:
    return "clients.html", {"data": await views.clients(ask)}


async def _longpoll(ask: Asker, request: Request) -> tuple[str, dict[str, Any]]:
    return "longpoll.html", {"data": await views.longpoll(ask)}


# -- signing in --------------------------------------------------------------------------------


def _safe_next(target: str) -> str:
    """Only a path of this console (no //host, no scheme): an open redirect otherwise."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/cluster"
    return quote(target, safe="/?=&")


async def login_form(request: Request) -> Response:
    return _render(request, "login.html", {"me": None, "next": request.query_params.get("next")})


async def login(request: Request) -> Response:
    form = await request.form()
    access_key = str(form.get("access_key", "")).strip()
    secret_key = str(form.get("secret_key", ""))
    target = _safe_next(str(form.get("next", "") or "/cluster"))
    state = state_of(request)
    address = state.address_of(request)
    wait = state.logins.retry_after(address, access_key)
    if wait:  # too many failed sign-ins from here, or for this access key
        context = {
            "me": None, "next": target, "access_key": access_key,
            "error": f"too many failed sign-ins: try again in {wait} s",
        }  # fmt: skip
        response = _render(request, "login.html", context, 429)
        response.headers["Retry-After"] = str(wait)
        return response
    credentials = Credentials(access_key, secret_key) if access_key and secret_key else None
    try:
        identity = await who_is(state.client, credentials)
    except ConsoleError as exc:
        if exc.http_status in (401, 403):
            state.logins.failed(address, access_key)
        context = {"me": None, "next": target, "error": exc.message, "access_key": access_key}
        return _render(request, "login.html", context, exc.http_status)
    if identity.acl and credentials is not None:
        state.logins.succeeded(address, access_key)
        state.sessions.close(request.session.get(SESSION_KEY))
        request.session[SESSION_KEY] = state.sessions.open(credentials)
    return RedirectResponse(target, 303)


async def logout(request: Request) -> Response:
    state_of(request).sessions.close(request.session.pop(SESSION_KEY, None))
    return RedirectResponse("/login", 303)


async def home(request: Request) -> Response:
    return RedirectResponse("/cluster", 303)


async def health(request: Request) -> Response:
    return HTMLResponse("ok")


routes = [
    Route("/", home),
    Route("/healthz", health),
    Route("/login", login_form),
    Route("/login", login, methods=["POST"]),
    Route("/logout", logout, methods=["POST"]),
    Route("/cluster", page(_cluster)),
    Route("/topics", page(_topics)),
    Route("/topics", page(_create_topic), methods=["POST"]),
    Route("/groups", page(_groups)),
    Route("/groups/reset-offset", page(_reset), methods=["POST"]),
    Route("/messages", page(_messages)),
    Route("/messages/send", page(_send), methods=["POST"]),
    Route("/dlq", page(_dlq)),
    Route("/dlq/resend", page(_resend), methods=["POST"]),
    Route("/clients", page(_clients)),
    Route("/longpoll", page(_longpoll)),
]
