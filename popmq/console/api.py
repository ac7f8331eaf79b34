"""The JSON API under /api/v1/: everything the pages show, for scripts and tests.

Authentication: HTTP Basic with an access key and secret key (or the pages' session cookie).
No credentials on a proxy with an ACL: 401 with a Basic challenge; too many wrong key pairs:
429 with Retry-After (login_limit.py, as the login form). Writes take a JSON body
(application/json), which a cross-site form cannot send.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from popmq.console import views
from popmq.console.admin_client import ConsoleError
from popmq.console.state import state_of
from popmq.console.views import Asker

Handler = Callable[[Asker, Request], Awaitable[dict[str, Any]]]


def error_response(exc: ConsoleError) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Basic realm="popmq"'} if exc.http_status == 401 else {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(exc.retry_after)
    return JSONResponse(
        {"error": {"code": exc.code, "message": exc.message}}, exc.http_status, headers=headers
    )


def endpoint(handler: Handler) -> Callable[[Request], Awaitable[JSONResponse]]:
    async def run(request: Request) -> JSONResponse:
        try:
            ask = await state_of(request).asker(request)
            return JSONResponse(await handler(ask, request))
        except ConsoleError as exc:
            return error_response(exc)

    return run


async def _body(request: Request) -> dict[str, Any]:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise ConsoleError(415, "BAD_REQUEST", "send a JSON body (Content-Type: application/json)")
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise ConsoleError(400, "BAD_REQUEST", "the body is not JSON") from None
    if not isinstance(body, dict):
        raise ConsoleError(400, "BAD_REQUEST", "the body must be a JSON object")
    return body


def _field(body: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    value = body.get(name, default)
    # JSON true is a Python int too: a bool only where a bool is asked for
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ConsoleError(400, "BAD_REQUEST", f"{name!r} must be a {kind.__name__}")
    if isinstance(value, int) and not isinstance(value, bool):
        return views.int32(name, value)
    return value


def _int_param(request: Request, name: str, default: int) -> int:
    text = request.query_params.get(name)
    if text is None:
        return default
    try:
        number = int(text)
    except ValueError:
        raise ConsoleError(400, "BAD_REQUEST", f"{name} must be a number") from None
    return views.int32(name, number)


async def _whoami(ask: Asker, request: Request) -> dict[str, Any]:
    identity = ask.identity
    return {"acl": identity.acl, "admin": identity.admin, "access_key": identity.access_key}


async def _cluster(ask: Asker, request: Request) -> dict[str, Any]:
    return await views.cluster(ask, state_of(request).rates)


async def _topics(ask: Asker, request: Request) -> dict[str, Any]:
    return await views.topics(ask, request.query_params.get("system") == "1")


async def _topic(ask: Asker, request: Request) -> dict[str, Any]:
    return await views.topic(ask, request.path_params["name"])


async def _create_topic(ask: Asker, request: Request) -> dict[str, Any]:
    body = await _body(request)
    name = _field(body, "name", str)
    return await views.create_topic(ask, name, _field(body, "queues", int, 8))


async def _groups(ask: Asker, request: Request) -> dict[str, Any]:
    return await views.groups(ask)


async def _group(ask: Asker, request: Request) -> dict[str, Any]:
    return await views.group(ask, request.path_params["name"])


async def _reset(ask: Asker, request: Request) -> dict[str, Any]:
    body = await _body(request)
    topic, to = _field(body, "topic", str), _field(body, "to", str)
    return await views.reset_offset(ask, request.path_params["name"], topic, to)


async def _messages(ask: Asker, request: Request) -> dict[str, Any]:
    q = request.query_params
    return await views.find_messages(
        ask, topic=q.get("topic", ""), message_id=q.get("id", ""), key=q.get("key", ""),
        since=q.get("since", ""), until=q.get("until", ""), limit=_int_param(request, "limit", 32),
    )  # fmt: skip


async def _send(ask: Asker, request: Request) -> dict[str, Any]:
    body = await _body(request)
    keys = _field(body, "keys", list, [])
    if not all(isinstance(k, str) for k in keys):
        raise ConsoleError(400, "BAD_REQUEST", "'keys' must be a list of strings")
    return await views.send_message(
        ask, _field(body, "topic", str), _field(body, "body", str, "").encode(),
        _field(body, "tag", str, ""), keys,
    )  # fmt: skip


# The proxy reads that many dead letters, bodies and all, into memory to answer: a user who
# may see a group's DLQ must not make it read the whole of a big one.
MAX_DLQ_LIMIT = 10_000


async def _dlq(ask: Asker, request: Request) -> dict[str, Any]:
    group = request.path_params["group"]
    limit = _int_param(request, "limit", 100)
    if not 1 <= limit <= MAX_DLQ_LIMIT:
        raise ConsoleError(400, "BAD_REQUEST", f"limit must be within [1, {MAX_DLQ_LIMIT}]")
    return await views.dlq(ask, group, limit)


async def _resend(ask: Asker, request: Request) -> dict[str, Any]:
    body = await _body(request)
    ids = _field(body, "ids", list, [])
    if not all(isinstance(i, str) for i in ids):
        raise ConsoleError(400, "BAD_REQUEST", "'ids' must be a list of message ids")
    everything = _field(body, "all", bool, False)
    return await views.resend_dlq(ask, request.path_params["group"], ids, everything)


async def _clients(ask: Asker, request: Request) -> dict[str, Any]:
    return await views.clients(ask)


async def _longpoll(ask: Asker, request: Request) -> dict[str, Any]:
    return await views.longpoll(ask)


routes = [
    Route("/api/v1/whoami", endpoint(_whoami)),
    Route("/api/v1/cluster", endpoint(_cluster)),
    Route("/api/v1/topics", endpoint(_topics)),
    Route("/api/v1/topics", endpoint(_create_topic), methods=["POST"]),
    Route("/api/v1/topics/{name}", endpoint(_topic)),
    Route("/api/v1/groups", endpoint(_groups)),
    Route("/api/v1/groups/{name}", endpoint(_group)),
    Route("/api/v1/groups/{name}/reset-offset", endpoint(_reset), methods=["POST"]),
    Route("/api/v1/messages", endpoint(_messages)),
    Route("/api/v1/messages", endpoint(_send), methods=["POST"]),
    Route("/api/v1/dlq/{group}", endpoint(_dlq)),
    Route("/api/v1/dlq/{group}/resend", endpoint(_resend), methods=["POST"]),
    Route("/api/v1/clients", endpoint(_clients)),
    Route("/api/v1/longpoll", endpoint(_longpoll)),
]
