"""The broker's error names, kept where the broker's callers have always imported them.

The tree itself (PopmqError, RefusedError, TransportError, ...) and the protocol Code live in
popmq.errors, at the bottom of the layers; see there.
"""

from __future__ import annotations

from popmq.errors import Code, DeadlineError, PopmqError, RefusedError, UnavailableError


class BrokerUnavailableError(UnavailableError):
    """A broker could not be reached (connection refused or lost, server shutting down).

    Raised by remote ports only; a caller may try another broker. A request in flight when the
    connection broke may or may not have been applied.
    """

    def __init__(self, broker: str, message: str) -> None:
        super().__init__(broker, f"broker {broker} unavailable: {message}")
        self.broker = broker


class BrokerTimeoutError(DeadlineError):
    """A broker did not answer a call before its deadline (hung, overloaded, partitioned)."""

    def __init__(self, broker: str, message: str) -> None:
        super().__init__(broker, f"broker {broker} did not answer: {message}")
        self.broker = broker


class BrokerAuthError(RefusedError):
    """A broker refused this proxy (gRPC UNAUTHENTICATED): the cluster token is wrong or missing.

    A deployment fault, not the client's: clients see INTERNAL_SERVER_ERROR with this text.
    """

    def __init__(self, broker: str, detail: str) -> None:
        super().__init__(
            Code.INTERNAL_SERVER_ERROR,
            f"broker {broker} refused this proxy ({detail}); the proxy's cluster token "
            "(proxy.broker_link.cluster_token_file) must match the broker's",
        )
        self.broker = broker


__all__ = [
    "BrokerAuthError",
    "BrokerTimeoutError",
    "BrokerUnavailableError",
    "Code",
    "PopmqError",
    "RefusedError",
]
