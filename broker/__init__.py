"""The popmq broker: durable store, POP bookkeeping, long polling and its gRPC server."""
