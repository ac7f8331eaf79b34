"""The broker port: the one interface the proxy uses to reach a broker, in-process or over gRPC."""
