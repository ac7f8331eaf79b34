"""The proxy's protocol-free core: domain in, domain out.

Sending, receiving, acking, routes and assignments, offsets, client settings and the admin
operations, written once over the broker cluster. Nothing here imports gRPC or protobuf (an
import-linter contract says so): the gRPC edge (popmq.proxy.grpc, popmq.proxy.admin) translates
protobuf to these operations and back, and any other edge can call them the same way.
"""
