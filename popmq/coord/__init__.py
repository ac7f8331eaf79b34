"""Coordination: leases, compare-and-swap and watches in an external store (etcd).

popmq never runs a consensus algorithm of its own. Broker groups elect their leader, keep their
in-sync set and register their members here (popmq.coord.group); proxies watch the same keys to
follow leaders (popmq.coord.directory). ``CoordStore`` is the one small interface; ``EtcdStore``
implements it over etcd's v3 JSON gateway. This package imports neither broker nor proxy.
"""

from popmq.coord.store import (
    Compare,
    CoordStore,
    CoordUnavailableError,
    Delete,
    KeyValue,
    LeaseLostError,
    Put,
    TxnResult,
    WatchEvent,
)

__all__ = [
    "Compare",
    "CoordStore",
    "CoordUnavailableError",
    "Delete",
    "KeyValue",
    "LeaseLostError",
    "Put",
    "TxnResult",
    "WatchEvent",
]
