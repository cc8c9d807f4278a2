"""moehome's networking: libp2p host and identity, framed tensor RPC, DHT of signed records.

Never imports torch, Qt, core or app (checked by tests/unit/test_architecture.py, and in a
real process by tests/processes/test_light_commands.py).
"""

from net._libp2p import PeerID
from net.dht import (
    DhtConfig,
    DhtError,
    DhtNode,
    NamespacedValidator,
    NamespaceRule,
    RecordRejected,
    SignedRecord,
)
from net.identity import Identity, IdentityError, load_or_create
from net.peer import Peer, PeerConfig, network_config, running_last
from net.rpc import (
    BadRequest,
    CallContext,
    DeadlineExceeded,
    Overloaded,
    PeerUnreachable,
    ProtocolViolation,
    RateLimited,
    RemoteError,
    Reply,
    RequestHead,
    RpcConfig,
    RpcError,
    RpcService,
    RpcTimeout,
    TooLarge,
    Unavailable,
    UnknownMethod,
)
from net.rpc.frames import Limits, Tensor
from net.transport.host import AddressError, DialError, SwarmHost, parse_peer_addr

__all__ = [
    "AddressError",
    "BadRequest",
    "CallContext",
    "DeadlineExceeded",
    "DhtConfig",
    "DhtError",
    "DhtNode",
    "DialError",
    "Identity",
    "IdentityError",
    "Limits",
    "NamespaceRule",
    "NamespacedValidator",
    "Overloaded",
    "Peer",
    "PeerConfig",
    "PeerID",
    "PeerUnreachable",
    "ProtocolViolation",
    "RateLimited",
    "RecordRejected",
    "RemoteError",
    "Reply",
    "RequestHead",
    "RpcConfig",
    "RpcError",
    "RpcService",
    "RpcTimeout",
    "SignedRecord",
    "SwarmHost",
    "Tensor",
    "TooLarge",
    "Unavailable",
    "UnknownMethod",
    "load_or_create",
    "network_config",
    "parse_peer_addr",
    "running_last",
]
