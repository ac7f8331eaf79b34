"""The broker contract: the port Protocols, their types and errors; no transport, no broker.

The proxy reaches a broker only through these: ``popmq.broker.local`` (same process) and
``popmq.broker.wire`` (gRPC) implement them.
"""
