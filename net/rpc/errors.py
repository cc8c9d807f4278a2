"""The errors a call can raise: local ones (timeout, unreachable peer, a reply that
breaks the protocol) and the typed refusals a remote handler sends back by code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Final

from net.rpc.frames import ErrorInfo


class RpcError(Exception):
    """Base class of every error a call can raise."""


class RpcTimeout(RpcError, TimeoutError):
    """The call's deadline passed before a response arrived."""


class PeerUnreachable(RpcError):
    """No stream to the peer could be opened, or the connection broke mid-call."""


class ProtocolViolation(RpcError):
    """The peer answered with something that is not a valid response."""


class RemoteError(RpcError):
    """The remote side answered with an error. Subclasses name the reason; handlers raise
    them to send that reason back."""

    code: ClassVar[str] = "remote_error"

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class BadRequest(RemoteError):
    code = "bad_request"


class UnknownMethod(RemoteError):
    code = "unknown_method"


class TooLarge(RemoteError):
    code = "too_large"


class RateLimited(RemoteError):
    code = "rate_limited"


class Overloaded(RemoteError):
    code = "overloaded"


class DeadlineExceeded(RemoteError):
    code = "deadline_exceeded"


class Unavailable(RemoteError):
    """The peer is up but will not do this now (paused, shutting down)."""

    code = "unavailable"


class InternalError(RemoteError):
    code = "internal"


_ERRORS_BY_CODE: Final[Mapping[str, type[RemoteError]]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        UnknownMethod,
        TooLarge,
        RateLimited,
        Overloaded,
        DeadlineExceeded,
        Unavailable,
        InternalError,
    )
} | {"bad_frame": BadRequest, "truncated": BadRequest}


def remote_error(info: ErrorInfo) -> RemoteError:
    cls = _ERRORS_BY_CODE.get(info.code)
    if cls is None:
        err = RemoteError(info.message)
        err.code = info.code  # type: ignore[misc]  # an unknown code from a newer peer
        return err
    return cls(info.message)
