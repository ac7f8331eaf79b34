"""The proxy server's one generic handler: namespaces and the access guard without grpc.aio
server interceptors.

A grpc.aio server with interceptors runs, for every call, a chain of coroutines (one per
interceptor and one per continuation, each continuation a partial) before it has the call's
handler. The namespace mapping and the access guard need of a call only what its handler
lookup already has (its method and headers), so they are done there: ``Edge.service`` is the
lookup grpc.aio makes for each call (in the call's own task, before it reads a byte of the
request). It hands out each method's handler wrapped once (the namespace mapping outside, the
guard's check inside, as the interceptors did) and, per call, authenticates a guarded method's
caller from the headers (a stranger gets the refusal that never reads the request,
``AccessGuard.admit``) and keeps the call's x-mq-namespace header (``namespace.enter``).
Tracing, when on, stays a server interceptor before this lookup (popmq.tracing).

No method is registered with grpc (``add_registered_method_handlers``): a registered method is
served by its registered handler without this lookup, and grpc.aio's accept loop awaits one
pending future per registered method for every call it accepts (add_tolerant). Health,
reflection and the admin services are looked up through the same handler, unchanged but for
the guard (admin).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from popmq.proxy.grpc import namespace
from popmq.proxy.grpc.access import GUARDED, AccessGuard, verifies


class Edge(grpc.GenericRpcHandler):
    """Collects a server's generic handlers (it stands in for the server while services are
    added) and serves them, guarded and namespaced, as the server's only generic handler."""

    def __init__(self, guard: AccessGuard | None, namespaces: bool = True) -> None:
        self._guard = guard
        self._namespaces = namespace.NamespaceInterceptor() if namespaces else None
        self._inner: list[grpc.GenericRpcHandler] = []
        # path -> (the handler to serve it, authenticate each call?, keep its namespace?):
        # the methods that exist, found and wrapped on their first call.
        self._served: dict[str, tuple[grpc.RpcMethodHandler, bool, bool]] = {}

    # -- what the generated add_*_to_server code (and add_tolerant) calls on a server ----------
    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._inner.extend(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        """Nothing: the generic handler each service also adds serves its methods."""

    # -- grpc.GenericRpcHandler ------------------------------------------------------------
    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler | None:
        details = handler_call_details
        path: str = details.method
        served = self._served.get(path)
        if served is None:
            served = self._find(path, details)
            if served is None:  # no such method (a guarded one's caller is checked first)
                if self._guard is not None and verifies(path):
                    return self._guard.admit(path, details.invocation_metadata)
                return None
        handler, authenticated, namespaced = served
        if authenticated:
            refusal = self._guard.admit(path, details.invocation_metadata)  # type: ignore[union-attr]
            if refusal is not None:
                return refusal
        if namespaced:
            namespace.enter(details.invocation_metadata)
        return handler

    def _find(self, path: str, details: Any) -> tuple[grpc.RpcMethodHandler, bool, bool] | None:
        """The method's handler from the services added (the first that has it), wrapped;
        kept (a made-up path, found in none, is not)."""
        for generic in self._inner:
            handler = generic.service(details)
            if handler is not None:
                break
        else:
            return None
        guard, namespaces = self._guard, self._namespaces
        guarded = guard is not None and path.startswith(GUARDED)
        if guarded:
            handler = guard.wrap(path, handler)  # type: ignore[union-attr]
        namespaced = namespaces is not None and path.startswith(namespace.SERVICE_PREFIX)
        if namespaced:
            handler = namespaces.wrap(handler, path)  # type: ignore[union-attr]
        served = (handler, guarded and verifies(path), namespaced)
        self._served[path] = served
        return served
