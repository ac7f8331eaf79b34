"""The gRPC edge of the proxy: the MessagingService servicer, request headers, the translators
(protobuf -> the core's domain objects -> protobuf) and status building.

Nothing here decides anything about messages or brokers: it reads requests, calls the core
(popmq.proxy.core), and turns its answers and exceptions into RocketMQ responses.
"""
