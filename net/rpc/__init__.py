"""Framed request/response RPC with tensor payloads: the service (pooled streams, typed
refusals, deadlines that travel, memory taken by arrival), its frames and errors."""

from net.rpc.calls import CallContext, Handler, Reply, ReplyLink, RequestHead, Screen
from net.rpc.errors import (
    BadRequest,
    DeadlineExceeded,
    InternalError,
    Overloaded,
    PeerUnreachable,
    ProtocolViolation,
    RateLimited,
    RemoteError,
    RpcError,
    RpcTimeout,
    TooLarge,
    Unavailable,
    UnknownMethod,
    remote_error,
)
from net.rpc.frames import Limits, Tensor
from net.rpc.service import RpcConfig, RpcService, RpcStatistics
from net.rpc.streams import RPC_PROTOCOL

__all__ = [
    "RPC_PROTOCOL",
    "BadRequest",
    "CallContext",
    "DeadlineExceeded",
    "Handler",
    "InternalError",
    "Limits",
    "Overloaded",
    "PeerUnreachable",
    "ProtocolViolation",
    "RateLimited",
    "RemoteError",
    "Reply",
    "ReplyLink",
    "RequestHead",
    "RpcConfig",
    "RpcError",
    "RpcService",
    "RpcStatistics",
    "RpcTimeout",
    "Screen",
    "Tensor",
    "TooLarge",
    "Unavailable",
    "UnknownMethod",
    "remote_error",
]
