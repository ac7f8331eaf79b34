"""Authentication and authorization at the proxy's gRPC boundary.

The edge's handler lookup (proxy/grpc/edge.py; `intercept_service` is the same check as a
server interceptor) guards the MessagingService and the AdminService. Each call is
authenticated (popmq.security: the MQv2-HMAC-SHA1 signature against the ACL's users) and then
authorized by what it touches, before the servicer runs, so a refused call reads and writes
nothing:

- SendMessage: publish on each message's topic;
- ReceiveMessage, AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue,
  PullMessage, GetOffset, UpdateOffset, QueryAssignment: subscribe as the group on the topic;
- QueryRoute, QueryOffset: publish or subscribe on the topic;
- Heartbeat: subscribe as its group (producers: signed in only); Telemetry: signed in, and
  a consumer's settings need subscribe as their group on their topics; NotifyClientTermination:
  signed in only; the unsupported EndTransaction and RecallMessage: publish on the topic,
  SyncLiteSubscription: subscribe (so implementing them later opens no hole);
- the AdminService: admin, except WhoAmI: signed in only (the console asks it to learn what a
  user may see). Anything else: admin (deny by default).

A group's derived topics (%RETRY%group+topic, %DLQ%group) are that group's own: no wildcard
grant reaches another group's (popmq.security.acl). The core learns who was let in through
popmq.proxy.core.caller: a route lookup creates a missing topic only for who may publish on it.

A refusal is answered as the protocol answers any refusal, with a Status of UNAUTHORIZED or
FORBIDDEN, counted in popmq_proxy_rpc_requests{code=...} and popmq_proxy_access_refusals{reason=...}
and logged (at most once a minute per user, method and code; never a secret). An unknown access
key and a wrong signature answer the same message; only the log and the reason label differ.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Callable
from contextvars import Context, ContextVar
from typing import Any

import grpc
from google.protobuf import message_factory
from popmq.broker.wire.undecodable import Undecodable
from popmq.proxy.core.caller import CALLER, Caller
from popmq.proxy.grpc import status as st
from popmq.proxy.grpc.headers import CALL_HEADERS
from popmq.proxy.metrics import ACCESS_REFUSALS, ACL_RELOAD_FAILURES, ProxyMetrics
from prometheus_client import Counter

from popmq.clock import SYSTEM, Clock
from popmq.config import ProxyConfig
from popmq.errors import Code
from popmq.handing import called, hands_over
from popmq.lifecycle import TaskOwner
from popmq.pb.admin.v1 import admin_pb2
from popmq.pb.rocketmq.v2 import admin_pb2 as upstream_admin_pb2
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.security import signature
from popmq.security.acl import AclFile, User
from popmq.security.authn import Authenticator
from popmq.security.errors import UNAUTHORIZED, AccessDenied, forbidden
from popmq.security.files import warn_if_exposed

log = logging.getLogger(__name__)
# The user verified for this call by the edge's lookup (grpc.aio runs a call's handler lookup
# and its handler in one task): check() takes it instead of verifying the signature again.
_VERIFIED: ContextVar[tuple[str, User] | None] = ContextVar("popmq_verified", default=None)

MESSAGING = "/apache.rocketmq.v2.MessagingService/"
ADMIN = "/popmq.admin.v1.AdminService/"
UPSTREAM_ADMIN = "/apache.rocketmq.v2.Admin/"  # rocketmq-apis' control plane: admin only
GUARDED = (MESSAGING, ADMIN, UPSTREAM_ADMIN)
_LOG_EVERY_S = 60.0
REVOCATION_CHECK_S = 0.25  # how often an open Telemetry stream checks its user is still in


def _name(resource: pb.Resource) -> str:
    return resource.name


def _group_on_topic(group: pb.Resource, topic: pb.Resource) -> Callable[[User], bool]:
    return lambda user: user.can_subscribe(_name(group), _name(topic))


def _rule(method: str, request: Any) -> tuple[Callable[[User], bool], str]:
    """(may this user do it?, what it needs, for the refusal message)."""
    if isinstance(request, Undecodable):
        # Nothing is read or written for a body that did not decode (the servicer answers
        # INVALID_ARGUMENT), so being signed in is enough to be told so.
        return (lambda user: True), ""
    if method in ("ReceiveMessage", "PullMessage", "GetOffset", "UpdateOffset"):
        group, topic = request.group, request.message_queue.topic
        return _group_on_topic(group, topic), f"subscribe {group.name} on {topic.name}"
    if method in ("AckMessage", "ChangeInvisibleDuration", "ForwardMessageToDeadLetterQueue"):
        return _group_on_topic(request.group, request.topic), (
            f"subscribe {request.group.name} on {request.topic.name}"
        )
    if method == "QueryAssignment":
        return _group_on_topic(request.group, request.topic), (
            f"subscribe {request.group.name} on {request.topic.name}"
        )
    if method == "SendMessage":
        topics = sorted({m.topic.name for m in request.messages})
        return (lambda user: all(user.can_publish(t) for t in topics)), (
            f"publish on {', '.join(topics)}"
        )
    if method in ("QueryRoute", "QueryOffset"):
        topic = request.topic if method == "QueryRoute" else request.message_queue.topic
        return (
            lambda user: user.can_read_topic(topic.name)
        ), f"publish or subscribe on {topic.name}"
    if method == "Heartbeat":
        if request.HasField("group") and request.group.name:
            return (lambda user: user.can_subscribe(request.group.name)), (
                f"subscribe {request.group.name}"
            )
        return (lambda user: True), ""
    # Not supported yet: still checked as they will need to be, so that implementing one
    # later cannot open a hole (a recall or a commit writes to the topic).
    if method in ("EndTransaction", "RecallMessage"):
        topic = request.topic.name
        return (lambda user: user.can_publish(topic)), f"publish on {topic}"
    if method == "SyncLiteSubscription":
        return _group_on_topic(request.group, request.topic), (
            f"subscribe {request.group.name} on {request.topic.name}"
        )
    if method in ("Telemetry", "NotifyClientTermination"):
        return (lambda user: True), ""
    return (lambda user: user.admin), "admin"


def _check_settings(user: User, command: Any) -> None:
    """FORBIDDEN unless the user may subscribe as the group a Telemetry settings names, on
    each topic it names."""
    if isinstance(command, Undecodable):  # the servicer answers it INVALID_ARGUMENT
        return
    if command.WhichOneof("command") != "settings":
        return
    settings = command.settings
    if settings.WhichOneof("pub_sub") != "subscription":
        return
    group = settings.subscription.group.name
    topics = [entry.topic.name for entry in settings.subscription.subscriptions] or [None]
    for topic in topics:
        if not user.can_subscribe(group, topic):
            where = f" on {topic}" if topic else ""
            raise forbidden(
                f"access key {user.access_key!r} may not Telemetry: needs subscribe {group}{where}"
            )


def _refused_response(response_class: type, method: str, request: Any, status: pb.Status) -> Any:
    response = response_class(status=status)
    if method == "SendMessage":  # the clients read one entry per message
        for message in request.messages:
            response.entries.add(status=status, message_id=message.system_properties.message_id)
    elif method == "ChangeInvisibleDuration":  # clients adopt the handle before the status
        response.receipt_handle = request.receipt_handle
    return response


class AccessGuard(grpc.aio.ServerInterceptor):
    """Wraps every guarded method's behavior with the authentication and permission check."""

    def __init__(
        self,
        authenticator: Authenticator,
        metrics: ProxyMetrics,
        refusals: Counter,
        max_calls_per_key: int = 10_000,
        open_calls: dict[str, int] | None = None,
        watchers: TaskOwner | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        self._clock = clock  # bounds the refusal log's rate
        self._authn = authenticator
        self._metrics = metrics
        self._refusals = refusals  # by reason: what the caller is not told
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}
        self._last_logged: dict[tuple[str, str, int], float] = {}
        self._max_calls = max_calls_per_key
        # Calls open now, by access key, over every listener (shared with for_another_server).
        self.open_calls: dict[str, int] = {} if open_calls is None else open_calls
        self._closers: dict[str, Callable[[Any], None]] = {}
        # Owns each open Telemetry stream's revocation watch (the server's stream owner, closed
        # with it). Not a task group inside the stream: a generator must not yield inside one.
        self._watchers = TaskOwner("revocation-watch", grace_s=0) if watchers is None else watchers

    def for_another_server(self) -> AccessGuard:
        """The same users for another listener: wrapped handlers are cached per server."""
        return AccessGuard(
            self._authn,
            self._metrics,
            self._refusals,
            self._max_calls,
            self.open_calls,
            self._watchers,
            self._clock,
        )

    def _open(self, user: User) -> None:
        """Count a call of this user's; TOO_MANY_REQUESTS past proxy.max_streams_per_access_key."""
        key = user.access_key
        now = self.open_calls.get(key, 0)
        if now >= self._max_calls:
            self._metrics.refused("streams_per_access_key")
            raise AccessDenied(
                Code.TOO_MANY_REQUESTS,
                f"access key {key!r} has {self._max_calls} calls open on this proxy already "
                "(proxy.max_streams_per_access_key)",
                reason="streams_per_access_key",
            )
        self.open_calls[key] = now + 1

    def _close(self, user: User) -> None:
        self._close_key(user.access_key)

    def _close_key(self, key: str) -> None:
        left = self.open_calls.get(key, 0) - 1
        if left > 0:
            self.open_calls[key] = left
        else:
            self.open_calls.pop(key, None)

    def _closer(self, key: str) -> Callable[[Any], None]:
        """A done callback giving a call of ``key``'s back (one per access key of the ACL,
        shared by its calls: nothing made per call)."""
        closer = self._closers.get(key)
        if closer is None:
            closer = self._closers[key] = functools.partial(_close_on_done, self, key)
        return closer

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        path: str = details.method
        if verifies(path):
            refusal = self.admit(path, details.invocation_metadata)
            if refusal is not None:
                return refusal
        cached = self._wrapped.get(path)
        if cached is not None:
            return cached
        handler = await continuation(details)
        if handler is None or not path.startswith(GUARDED):
            return handler  # health and reflection stay open
        return self.wrap(path, handler)

    def admit(self, path: str, metadata: Any) -> grpc.RpcMethodHandler | None:
        """Authenticate a call of ``path`` (one ``verifies`` is true for) from its headers,
        before grpc reads (and buffers, up to the receive limit) one byte of its request:
        a stranger gets the refusal's handler, which never reads it; anyone else None, with
        the user and the headers kept for the call's handler (in the call's own task)."""
        headers = _text_headers(metadata)
        try:
            user = self._authn.authenticate(headers)
        except AccessDenied as exc:
            return _unread_refusal(self, path, exc)
        _VERIFIED.set((path, user))
        CALL_HEADERS.set(headers)  # the handler's request context reads these
        return None

    def wrap(self, path: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` (of a guarded method) with the check before it: wrapped once a path."""
        wrapped = self._wrapped.get(path)
        if wrapped is None:
            wrapped = self._wrapped[path] = self._wrap(path, handler)
        return wrapped

    # -- the check -------------------------------------------------------------------------
    def check(self, path: str, request: Any, context: grpc.aio.ServicerContext) -> User:
        """The caller, if signed in and allowed; AccessDenied otherwise. Never touches data."""
        verified = _VERIFIED.get()
        if verified is not None and verified[0] == path:
            user = verified[1]  # this call's headers, verified a moment ago
        else:
            user = self._authn.authenticate(_text_headers(context.invocation_metadata()))
        method = path.rsplit("/", 1)[1]
        if path == ADMIN + "WhoAmI":  # anyone signed in may ask who they are
            allowed, needs = (lambda u: True), ""
        elif path.startswith((ADMIN, UPSTREAM_ADMIN)):
            allowed, needs = (lambda u: u.admin), "admin"
        else:
            allowed, needs = _rule(method, request)
        if not allowed(user):
            raise forbidden(f"access key {user.access_key!r} may not {method}: needs {needs}")
        return user

    async def _end_when_revoked(
        self, user: User, context: grpc.aio.ServicerContext, revoked: list[bool]
    ) -> None:
        """Abort the stream once the ACL no longer holds this user with this secret (the ACL
        file is re-read at most once a second)."""
        while True:
            await asyncio.sleep(REVOCATION_CHECK_S)
            now = self._authn.acl.user(user.access_key)
            if now is None or now.secret_key != user.secret_key:
                break
        revoked.append(True)
        self._refusals.labels("revoked").inc()
        log.info(
            "ending the Telemetry stream of access key %r: removed from the ACL", user.access_key
        )
        try:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "the access key was revoked")
        except Exception:  # abort ends the call by raising: the stream is over, nothing to add
            pass

    def _refused(
        self, path: str, exc: AccessDenied, context: grpc.aio.ServicerContext
    ) -> pb.Status:
        method = path.rsplit("/", 1)[1]
        code_name = Code(exc.code).name
        self._metrics.rpc_refused(method, code_name)
        self._refusals.labels(exc.reason).inc()
        credential = ""
        for name, value in context.invocation_metadata() or ():
            if name.lower() == signature.AUTH_HEADER and isinstance(value, str):
                credential = value.partition("Credential=")[2].split(",")[0][:64]
        # Made-up access keys share one slot: a stranger must not get a log line (and a slot
        # in this table) per key it invents.
        known = bool(credential) and self._authn.acl.user(credential) is not None
        key = (credential if known else "", method, exc.code)
        now = self._clock.monotonic()
        if now - self._last_logged.get(key, -_LOG_EVERY_S) >= _LOG_EVERY_S:
            self._last_logged[key] = now
            log.warning(
                "refused %s from %s (access key %r): %s %s",
                method, context.peer(), credential, code_name, exc.detail,
            )  # fmt: skip
        return st.status(exc.code, exc.message)

    # -- wrapping each kind of method ------------------------------------------------------
    def _wrap(self, path: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        method = path.rsplit("/", 1)[1]
        response_class = _response_class(path)
        guard = self

        if not handler.request_streaming and not handler.response_streaming:
            inner = called(handler.unary_unary)

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    user = guard.check(path, request, context)
                    guard._open(user)
                except AccessDenied as exc:
                    status = guard._refused(path, exc, context)
                    if not _has_status(response_class):  # upstream's ChangeLogLevel
                        await context.abort(_grpc_code(exc), status.message)
                    return _refused_response(response_class, method, request, status)
                token = CALLER.set(_caller(user))
                try:
                    return await inner(request, context)
                finally:
                    CALLER.reset(token)
                    guard._close(user)

            return _rebuild(grpc.unary_unary_rpc_method_handler, unary, handler)

        if not handler.request_streaming:  # ReceiveMessage, PullMessage: servicers write()
            inner = called(handler.unary_stream)

            async def refuse(exc: AccessDenied, context: grpc.aio.ServicerContext) -> None:
                status = guard._refused(path, exc, context)
                await context.write(response_class(status=status))
                if method == "ReceiveMessage":
                    trailer = response_class()
                    trailer.delivery_timestamp.GetCurrentTime()
                    await context.write(trailer)

            # Hands the call over (popmq.handing): no frame of the guard's is kept while the
            # stream runs (a held long poll's, 10,000 of them). The call's place is given
            # back when its task ends (grpc.aio runs the context's done callbacks then,
            # whatever ended it), and the caller is set in the call's own task (each call
            # runs in its own) for the whole call, never reset.
            @hands_over
            def server_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    user = guard.check(path, request, context)
                    guard._open(user)
                except AccessDenied as exc:
                    return refuse(exc, context)
                _when_done(context, guard._closer(user.access_key))
                CALLER.set(_caller(user))
                return inner(request, context)

            return _rebuild(grpc.unary_stream_rpc_method_handler, server_stream, handler)

        if handler.response_streaming and inspect.isasyncgenfunction(handler.stream_stream):
            inner = handler.stream_stream  # Telemetry: an async generator

            async def bidi(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    user = guard.check(path, None, context)
                    guard._open(user)
                except AccessDenied as exc:
                    yield response_class(status=guard._refused(path, exc, context))
                    return
                try:
                    async for answer in guarded_bidi(user, requests, context):
                        yield answer
                finally:
                    guard._close(user)

            async def guarded_bidi(user: User, requests: Any, context: Any) -> Any:
                # Each RPC runs in its own task: set for the whole stream, never reset across
                # yields (a generator may resume in another context).
                CALLER.set(_caller(user))
                # Settings name a group: joining it (queue assignment, its retry policy) needs
                # the same grant as consuming it. A refused command ends the stream.
                refused: list[AccessDenied] = []

                async def allowed_commands() -> Any:
                    async for command in requests:
                        try:
                            _check_settings(user, command)
                        except AccessDenied as exc:
                            refused.append(exc)
                            return
                        yield command

                # A user removed from the ACL (or given a new secret) loses the open stream too.
                revoked: list[bool] = []
                watch = guard._end_when_revoked(user, context, revoked)
                watcher = guard._watchers.spawn(watch, "revocation-watch")
                try:
                    async for answer in inner(allowed_commands(), context):
                        yield answer
                    if refused:
                        first = refused[0]
                        yield response_class(status=guard._refused(path, first, context))
                except Exception:
                    if not revoked:
                        raise
                    # Aborted for the revocation: the reads that failed with it say nothing new.
                finally:
                    if watcher is not None:  # cancel works from any task (a finalizer's, too)
                        watcher.cancel()

            return _rebuild(grpc.stream_stream_rpc_method_handler, bidi, handler)
        return handler  # no such method in the guarded services


def _close_on_done(guard: AccessGuard, key: str, _context: Any) -> None:
    guard._close_key(key)


# The context the done callbacks run in: they read no context variable, and a callback added
# without one would copy the call's context (an object per call, kept for the whole call).
_DONE_CONTEXT = Context()


def _when_done(context: grpc.aio.ServicerContext, callback: Callable[[Any], None]) -> None:
    """``callback`` once the call's task ends, whatever ended it. A call runs in its own task
    (grpc.aio), so its task's done callback is the call's: the task keeps its first callback in
    place, where the context's done callbacks cost a list entry and a partial per call (about
    240 B of a held long poll's; docs/benchmarks.md, "Idle polls, wave 11")."""
    task = asyncio.current_task()
    if task is None:  # not in a task of its own (never in grpc.aio): the context's callbacks
        context.add_done_callback(callback)
        return
    task.add_done_callback(callback, context=_DONE_CONTEXT)


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


def _text_headers(metadata: Any) -> dict[str, str]:
    return {key.lower(): value for key, value in metadata or () if isinstance(value, str)}


def _unread_refusal(guard: AccessGuard, path: str, exc: AccessDenied) -> grpc.RpcMethodHandler:
    """UNAUTHORIZED, answered as the protocol answers it, without reading the request.

    grpc.aio receives a unary request whole (and decodes it) before it calls the handler, so
    the refusal is registered as request-streaming with no deserializer and never reads: the
    answer goes out and grpc resets the stream. A SendMessage refused so has no entries (its
    messages are not read); clients check the top-level status first."""
    method = path.rsplit("/", 1)[1]
    response_class = _response_class(path)
    streaming = _method_descriptor(path).server_streaming

    def frames(context: grpc.aio.ServicerContext) -> list[Any]:
        answer = [response_class(status=guard._refused(path, exc, context))]
        if method == "ReceiveMessage":  # the stream ends with its delivery timestamp
            trailer = response_class()
            trailer.delivery_timestamp.GetCurrentTime()
            answer.append(trailer)
        return answer

    if streaming:

        async def stream(_requests: Any, context: grpc.aio.ServicerContext) -> Any:
            for frame in frames(context):
                yield frame

        return grpc.stream_stream_rpc_method_handler(stream, response_serializer=_serialize)

    async def unary(_requests: Any, context: grpc.aio.ServicerContext) -> Any:
        if not _has_status(response_class):  # upstream's ChangeLogLevel
            await context.abort(_grpc_code(exc), guard._refused(path, exc, context).message)
        return frames(context)[0]

    return grpc.stream_unary_rpc_method_handler(unary, response_serializer=_serialize)


# The caller of the last call by each access key: a held long poll keeps its Caller (and its
# bound can_publish) for the whole poll, so 10,000 polls of one key share one. Keyed by access
# key and checked by identity, so an ACL reload (new User objects) makes a new one.
_CALLERS: dict[str, Caller] = {}


def _caller(user: User) -> Caller:
    """What the core may know of the caller: its key, and that lookups by someone who
    may not publish on a topic never auto-create it (RocketMQ creates topics on send)."""
    cached = _CALLERS.get(user.access_key)
    if cached is not None and cached.user is user:
        return cached
    caller = Caller(access_key=user.access_key, may_create_topic=user.can_publish, user=user)
    _CALLERS[user.access_key] = caller  # one per access key of the ACL: bounded
    return caller


def _rebuild(make: Any, behavior: Any, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    return make(
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def verifies(path: str) -> bool:
    """Is a call of ``path`` authenticated from its headers (a method of a guarded service)?"""
    return path.startswith(GUARDED) and _method_descriptor(path) is not None


@functools.lru_cache(maxsize=256)  # asked on every call (2.8 us a lookup); made-up paths evict
def _method_descriptor(path: str) -> Any:
    """The method's descriptor; None for a path no guarded service has."""
    service, _, method = path.strip("/").rpartition("/")
    pool_file = (
        admin_pb2.DESCRIPTOR if path.startswith(ADMIN)
        else upstream_admin_pb2.DESCRIPTOR if path.startswith(UPSTREAM_ADMIN)
        else s.DESCRIPTOR
    )  # fmt: skip
    found = pool_file.services_by_name.get(service.rsplit(".", 1)[-1])
    return None if found is None else found.methods_by_name.get(method)


def _has_status(response_class: type) -> bool:
    return "status" in response_class.DESCRIPTOR.fields_by_name  # type: ignore[attr-defined]


def _grpc_code(exc: AccessDenied) -> grpc.StatusCode:
    unauthorized = exc.code == UNAUTHORIZED
    return grpc.StatusCode.UNAUTHENTICATED if unauthorized else grpc.StatusCode.PERMISSION_DENIED


def _response_class(path: str) -> type:
    return message_factory.GetMessageClass(_method_descriptor(path).output_type)


def access_guard(
    config: ProxyConfig, metrics: ProxyMetrics, watchers: TaskOwner | None = None
) -> AccessGuard | None:
    """The guard for the configured ACL; None (open, a WARNING) without one. Its stream watches
    run in watchers (the server's stream owner)."""
    if config.acl is None:
        log.warning(
            "authentication is OFF: anyone who can reach this proxy may publish, consume and "
            "administer (local development only; give --acl FILE to turn it on)"
        )
        return None
    failures = ACL_RELOAD_FAILURES.build(metrics.registry)
    acl = AclFile(config.acl, on_reload_failure=failures.inc)  # re-read when the file changes
    warn_if_exposed(config.acl, "ACL file")
    verifier = signature.SignatureVerifier(
        config.auth_clock_skew_ms / 1000, any_timezone=config.auth_any_timezone
    )
    refusals = ACCESS_REFUSALS.build(metrics.registry)
    log.info("authentication on: %d users from %s", len(acl.acl.users), config.acl)
    return AccessGuard(
        Authenticator(acl, verifier),
        metrics,
        refusals,
        config.max_streams_per_access_key,
        watchers=watchers,
    )
