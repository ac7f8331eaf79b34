"""The thin gRPC layer: the MessagingService servicer, request headers, status building.

Nothing here knows about brokers; it parses requests, calls an activity, and turns results and
exceptions into RocketMQ responses.
"""
