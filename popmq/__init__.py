"""popmq: RocketMQ 5 POP consumption behind a stateless gRPC proxy."""

__version__ = "0.1.0"
