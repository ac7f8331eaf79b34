"""Namespaces at the proxy's edge: `x-mq-namespace` / `Resource.resource_namespace` scope topics
and groups, as in RocketMQ 5.

Inside popmq a namespaced resource is just another name, `NAMESPACE%name` (RocketMQ's
`NamespaceUtil` form), so brokers, routes, assignments, offsets and the retry / DLQ names the
broker derives from them (`%RETRY%ns%group...`, `%DLQ%ns%group`) stay inside their namespace
with no change behind this module. The edge (proxy/grpc/edge.py) qualifies every Resource of a
MessagingService request on the way in and strips the prefix from every Resource of the answer
on the way out. Clients without a namespace see no change at all (and pay nothing).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from functools import cache
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import DLQ_PREFIX, RETRY_PREFIX
from popmq.proxy.grpc import status as st

from popmq.handing import called, hands_over
from popmq.pb.rocketmq.v2 import definition_pb2 as d
from popmq.pb.rocketmq.v2 import service_pb2 as s

SEPARATOR = "%"
RESOURCE = "apache.rocketmq.v2.Resource"
SERVICE_PREFIX = "/apache.rocketmq.v2.MessagingService/"
HEADER = "x-mq-namespace"
# RocketMQ's namespace rule: its name characters, without the separator, at most 64.
_NAMESPACE = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def qualify(namespace: str, name: str, *, group: bool = False) -> str:
    """The broker-side name of `name` in `namespace` ("" = no namespace: unchanged)."""
    if not namespace or not name:
        return name
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):  # a DLQ a client reads: %DLQ%group
        if name.startswith(prefix):
            return prefix + qualify(namespace, name[len(prefix) :], group=True)
    if SEPARATOR in name:
        code = Code.ILLEGAL_CONSUMER_GROUP if group else Code.ILLEGAL_TOPIC
        raise RefusedError(code, f"{name!r}: names in a namespace cannot contain '{SEPARATOR}'")
    return f"{namespace}{SEPARATOR}{name}"


def unqualify(namespace: str, name: str) -> str:
    """The client-side name of a broker-side name seen from `namespace`."""
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if name.startswith(prefix):
            return prefix + unqualify(namespace, name[len(prefix) :])
    own = f"{namespace}{SEPARATOR}"
    return name[len(own) :] if namespace and name.startswith(own) else name


def check_namespace(namespace: str) -> str:
    if namespace and not _NAMESPACE.fullmatch(namespace):
        raise RefusedError(
            Code.BAD_REQUEST,
            f"namespace {namespace!r} must be 1..64 characters of [a-zA-Z0-9_-]",
        )
    return namespace


# -- walking the Resources of a message (never touching bodies) ----------------------------------


@cache
def _resource_fields(descriptor: Descriptor) -> tuple[FieldDescriptor, ...]:
    """Fields of this message type that are, or contain, a Resource."""
    return tuple(
        field
        for field in descriptor.fields
        if field.message_type is not None
        and not field.message_type.GetOptions().map_entry
        and (field.message_type.full_name == RESOURCE or _contains_resource(field.message_type))
    )


@cache
def _contains_resource(descriptor: Descriptor, _seen: frozenset[str] = frozenset()) -> bool:
    if descriptor.full_name in _seen:
        return False
    seen = _seen | {descriptor.full_name}
    for field in descriptor.fields:
        kind = field.message_type
        if kind is None or kind.GetOptions().map_entry:
            continue
        if kind.full_name == RESOURCE or _contains_resource(kind, seen):
            return True
    return False


@cache
def _walk_plan(descriptor: Descriptor) -> tuple[tuple[str, bool, bool, bool], ...]:
    """(field name, repeated, is a Resource, is the group) for each of ``_resource_fields``:
    read once per message type, not per request (every request is walked)."""
    return tuple(
        (
            field.name,
            field.is_repeated,
            field.message_type is not None and field.message_type.full_name == RESOURCE,
            field.name == "group",
        )
        for field in _resource_fields(descriptor)
    )


@cache
def _singular_paths(descriptor: Descriptor) -> tuple[tuple[str, ...], ...] | None:
    """The attribute paths to every Resource of this message type, in ``_collect``'s order,
    when none goes through a repeated field (ReceiveMessage's, for one); else None."""
    paths: list[tuple[str, ...]] = []

    def walk(kind: Descriptor, prefix: tuple[str, ...], seen: frozenset[str]) -> bool:
        if kind.full_name in seen:
            return False
        for name, repeated, is_resource, _ in _walk_plan(kind):
            if repeated:
                return False
            if is_resource:
                paths.append((*prefix, name))
                continue
            inner = kind.fields_by_name[name].message_type
            if inner is None or not walk(inner, (*prefix, name), seen | {kind.full_name}):
                return False
        return True

    return tuple(paths) if walk(descriptor, (), frozenset()) else None


def _first_namespace(message: Message) -> str | None:
    """The first non-empty resource_namespace in the message ("" if none), read along the
    type's fixed paths (a request walked per call: 3-4% of a receive's CPU); None when the
    type has no fixed paths. An unset message field reads as its empty default."""
    paths = _singular_paths(message.DESCRIPTOR)
    if paths is None:
        return None
    for path in paths:
        value: Any = message
        for name in path:
            value = getattr(value, name)
        if value.resource_namespace:
            return str(value.resource_namespace)
    return ""


def _resources(message: Message) -> list[tuple[d.Resource, bool]]:
    """(Resource, is-a-group) pairs in message."""
    found: list[tuple[d.Resource, bool]] = []
    if isinstance(message, Message):  # else an undecodable body: its guard answers it
        _collect(message, found)
    return found


def _collect(message: Message, found: list[tuple[d.Resource, bool]]) -> None:
    _collect_planned(message, _walk_plan(message.DESCRIPTOR), found)


def _collect_planned(
    message: Message,
    plan: tuple[tuple[str, bool, bool, bool], ...],
    found: list[tuple[d.Resource, bool]],
) -> None:
    """``_collect`` with ``message``'s plan in hand: the elements of a repeated field share
    one type, so their plan is looked up once (a 16-message send walked in 31 us, ~2 a
    message; the lookup per element and a generator per Resource were half of it)."""
    append = found.append
    for name, repeated, is_resource, is_group in plan:
        if repeated:
            values = getattr(message, name)
            if not values:
                continue
        elif message.HasField(name):
            values = (getattr(message, name),)
        else:
            continue
        if is_resource:
            for value in values:
                append((value, is_group))
        else:
            child = _walk_plan(values[0].DESCRIPTOR)
            if len(child) == 1 and child[0][2] and not child[0][1]:
                # each element holds one Resource (a send's messages: their topic)
                field, _, _, field_is_group = child[0]
                for value in values:
                    if value.HasField(field):
                        append((getattr(value, field), field_is_group))
                continue
            for value in values:
                _collect_planned(value, child, found)


def qualify_request(message: Message, header_namespace: str) -> None:
    for resource, is_group in _resources(message):
        namespace = check_namespace(resource.resource_namespace or header_namespace)
        if namespace:
            resource.name = qualify(namespace, resource.name, group=is_group)


def unqualify_response(message: Message, namespace: str) -> None:
    for resource, _ in _resources(message):
        stripped = unqualify(namespace, resource.name)
        if stripped != resource.name:
            resource.name = stripped
            resource.resource_namespace = namespace


# -- the interceptor -------------------------------------------------------------------------------


class _Context:
    """The servicer context, with writes (streamed answers) unqualified first."""

    def __init__(self, context: grpc.aio.ServicerContext, namespace: str) -> None:
        self._context = context
        self._namespace = namespace

    async def write(self, message: Message) -> None:
        unqualify_response(message, self._namespace)
        await self._context.write(message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def served_in(context: Any) -> tuple[Any, str]:
    """(the call's own context, the namespace it is served in) for a streaming call this
    interceptor wrapped, else (context, ""). A servicer that builds its frames already
    unqualified (convert.popped_into's ``unqualify_for``) writes them to the call's own
    context: no walk of each frame's Resources (4-8 µs a delivered message)."""
    if isinstance(context, _Context):
        return context._context, context._namespace
    return context, ""


def _status_frame(method: str, error: RefusedError) -> Message:
    """The method's response carrying the refusal as a RocketMQ Status (never a gRPC error)."""
    service = s.DESCRIPTOR.services_by_name["MessagingService"]
    output = service.methods_by_name[method.rsplit("/", 1)[-1]].output_type
    response: Any = message_factory.GetMessageClass(output)()
    response.status.CopyFrom(st.status(error.code, error.message))
    return response


# The x-mq-namespace header of the call being served: set by the edge's lookup in the call's
# own task (grpc.aio runs the lookup and the handler there) and read by the wrapped behaviors,
# so a wrapped handler serves every call of its method (no closure made per call, kept by each
# held long poll).
_HEADER: ContextVar[str] = ContextVar("popmq_namespace_header", default="")


def enter(metadata: Any) -> None:
    """Keep the call's x-mq-namespace header for its wrapped handler (in the call's task)."""
    header = ""
    for key, value in metadata or ():
        if key == HEADER:
            header = value
    _HEADER.set(header)


class NamespaceInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self) -> None:
        # method -> (the handler grpc gave, our wrapper of it): wrapped once, not per call.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)  # every call: the guard checks each one
        method = details.method
        if handler is None or not method.startswith(SERVICE_PREFIX):
            return handler
        enter(details.invocation_metadata)
        return self.wrap(handler, method)

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """``handler`` (of a MessagingService method) mapped to and from the namespace of
        each call (``enter``): wrapped once, not per call."""
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, method)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        # _replace, not grpc.*_rpc_method_handler: those import grpc._utilities on every
        # call (3% of an idle proxy's samples at 500 receives/s under py-spy).
        if handler.unary_unary:
            return handler._replace(unary_unary=self._unary(handler, method))
        if handler.unary_stream:
            return handler._replace(unary_stream=self._unary_stream(handler, method))
        if handler.stream_stream:
            return handler._replace(stream_stream=self._stream_stream(handler))
        return handler

    @staticmethod
    def _namespace_of(request: Message, header: str) -> str:
        if isinstance(request, Message):
            found = _first_namespace(request)
            if found is not None:
                return found or header
        for resource, _ in _resources(request):
            if resource.resource_namespace:
                return resource.resource_namespace
        return header

    def _unary(self, handler: grpc.RpcMethodHandler, method: str) -> Callable[..., Any]:
        behavior = called(handler.unary_unary)

        async def namespaced(
            request: Message, context: grpc.aio.ServicerContext, namespace: str, header: str
        ) -> Message:
            try:
                qualify_request(request, header)
            except RefusedError as error:
                return _status_frame(method, error)
            response = await behavior(request, context)
            unqualify_response(response, namespace)
            return response

        @hands_over  # a call with no namespace: no frame of this wrapper's (popmq.handing)
        def call(request: Message, context: grpc.aio.ServicerContext) -> Awaitable[Message]:
            header = _HEADER.get()
            namespace = self._namespace_of(request, header)
            if not namespace:
                return behavior(request, context)
            return namespaced(request, context, namespace, header)

        return call

    def _unary_stream(self, handler: grpc.RpcMethodHandler, method: str) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(handler.unary_stream):  # a servicer that yields frames
            return self._unary_stream_yielding(handler, method)
        behavior = called(handler.unary_stream)

        # Hands the call over (popmq.handing): all its work comes before the behavior, so
        # no frame of it is kept while the behavior runs (a held long poll's, 10,000 of them).
        @hands_over
        def call(request: Message, context: grpc.aio.ServicerContext) -> Awaitable[None]:
            header = _HEADER.get()
            namespace = self._namespace_of(request, header)
            if not namespace:
                return behavior(request, context)
            try:
                qualify_request(request, header)
            except RefusedError as error:
                return context.write(_status_frame(method, error))
            return behavior(request, _Context(context, namespace))

        return call

    def _unary_stream_yielding(
        self, handler: grpc.RpcMethodHandler, method: str
    ) -> Callable[..., Any]:
        behavior = handler.unary_stream

        async def call(
            request: Message, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Message]:
            header = _HEADER.get()
            namespace = self._namespace_of(request, header)
            if namespace:
                try:
                    qualify_request(request, header)
                except RefusedError as error:
                    yield _status_frame(method, error)
                    return
            async for frame in behavior(request, context):
                if namespace:
                    unqualify_response(frame, namespace)
                yield frame

        return call

    def _stream_stream(self, handler: grpc.RpcMethodHandler) -> Callable[..., Any]:
        behavior = handler.stream_stream

        async def call(
            requests: AsyncIterator[Message], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Message]:
            header = _HEADER.get()
            seen: dict[str, str] = {"namespace": header}

            async def qualified() -> AsyncIterator[Message]:
                async for request in requests:
                    seen["namespace"] = self._namespace_of(request, seen["namespace"])
                    try:
                        qualify_request(request, header)
                    except RefusedError as error:  # a name no namespace may hold: end the stream
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error.message)
                    yield request

            async for response in behavior(qualified(), context):
                unqualify_response(response, seen["namespace"])
                yield response

        return call
