"""What a handler is given and returns, and what a screen sees of a request before its
payload is read."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from net._libp2p import PeerID
from net.rpc.errors import RemoteError
from net.rpc.frames import Request, Tensor


@dataclass(frozen=True)
class Reply:
    meta: Mapping[str, Any] = field(default_factory=dict)
    tensors: tuple[Tensor, ...] = ()


@dataclass(frozen=True)
class CallContext:
    peer_id: PeerID
    request: Request
    #: the caller's address as limits count it (net.transport.admission.source_of)
    source: str = "?"
    #: when the handler was handed the request (trio's clock): an answer can say how
    #: long it took here, so that the caller can tell that from the link's share
    arrived: float = field(default_factory=trio.current_time)


Handler = Callable[[CallContext], Awaitable[Reply]]


@dataclass(frozen=True)
class RequestHead:
    """What is known of a request before its payload is read: enough to refuse it
    without holding a byte of that payload."""

    peer_id: PeerID
    source: str
    method: str
    meta: Mapping[str, Any]
    payload_bytes: int
    #: dtype and shape of each tensor the payload holds
    specs: tuple[tuple[str, tuple[int, ...]], ...] = ()


#: Decides from a request's head alone: an error to refuse it with, or None to read it.
#: Runs on the event loop for every request of its method: it must be cheap (no
#: signature checks).
Screen = Callable[[RequestHead], RemoteError | None]


class ReplyLink(Protocol):
    """Holds each answer as a slow home line would before it is sent: the rig's
    emulated link (net/testing/link.py). None in real use."""

    async def carry(self, nbytes: int) -> None: ...
