"""The broker on the wire: popmq.broker.v1 over gRPC.

The remote port and its links (request link, watch link, coalescer) on the proxy side; the
servicer and server on the broker side; the protobuf codecs both share.
"""
