"""One activity per RPC family: validate the request, call brokers, build the response.

Activities take and return protobuf messages and raise RefusedError for anything the client
got wrong; the gRPC servicer turns those into statuses. They reach brokers only through the
BrokerCluster, never knowing whether a broker is in-process or remote.
"""
