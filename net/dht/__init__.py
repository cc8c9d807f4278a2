"""moehome's DHT: signed, expiring records on the peers closest to their key."""

from net.dht.node import DhtConfig, DhtError, DhtNode, DhtStatistics
from net.dht.records import (
    BUILTIN_NAMESPACES,
    NamespacedValidator,
    NamespaceRule,
    RecordRejected,
    SignedRecord,
    sign_record,
)

__all__ = [
    "BUILTIN_NAMESPACES",
    "DhtConfig",
    "DhtError",
    "DhtNode",
    "DhtStatistics",
    "NamespaceRule",
    "NamespacedValidator",
    "RecordRejected",
    "SignedRecord",
    "sign_record",
]
