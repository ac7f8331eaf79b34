"""Errors the client raises: the proxy's RocketMQ status, or a transport failure."""

from __future__ import annotations

from popmq.broker.api.errors import BrokerError, Code


class ProxyError(BrokerError):
    """A request the proxy answered with a non-OK status (code is the RocketMQ Code)."""

    def __init__(self, code: Code | int, message: str, rpc: str = "") -> None:
        raw_code = int(code)
        try:
            known = Code(raw_code)
        except ValueError:  # a code this popmq does not name: keep the number in the text
            known, message = Code.INTERNAL_ERROR, f"[code {raw_code}] {message}"
        prefix = f"{rpc}: " if rpc else ""
        super().__init__(known, f"{prefix}{message}")
        self.rpc = rpc
        self.raw_code = raw_code


class ProxyUnavailable(ProxyError):
    """The proxy could not be reached or did not answer in time (a gRPC transport error)."""

    def __init__(self, endpoint: str, rpc: str, detail: str, timed_out: bool = False) -> None:
        code = Code.PROXY_TIMEOUT if timed_out else Code.INTERNAL_ERROR
        what = "timed out" if timed_out else "failed"
        super().__init__(code, f"call to popmq proxy at {endpoint} {what}: {detail}", rpc)
        self.endpoint = endpoint
        self.timed_out = timed_out
