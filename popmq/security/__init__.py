"""Identity and access shared by the broker and the proxy: request signatures (AK/SK), the ACL,
TLS credentials and the cluster token of the proxy-to-broker link. Bottom layer: imports no
popmq server code."""
