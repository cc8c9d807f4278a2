"""The RPC's libp2p streams as both ends handle them: the protocol id they are opened
with, and ending, draining or locating one without raising (a stream that broke has
nothing more to say, and its error must not end the caller or the server)."""

from __future__ import annotations

import contextlib
from typing import Any, Final

import trio
from libp2p.exceptions import BaseLibp2pError

from net.rpc.frames import MiB

RPC_PROTOCOL: Final = "/moehome/rpc/1.0.0"


def remote_host(stream: Any) -> str | None:
    try:
        remote = stream.get_remote_address()
    except (BaseLibp2pError, OSError, AttributeError):
        return None
    return str(remote[0]) if remote else None


async def drain_quietly(stream: Any, max_bytes: int, *, seconds: float) -> None:
    """Read and drop up to ``max_bytes`` (without keeping them) for at most ``seconds``."""
    left = max_bytes
    with trio.move_on_after(seconds):
        try:
            while left > 0:
                chunk = await stream.read(min(left, 1 * MiB))
                if not chunk:
                    return
                left -= len(chunk)
        except (BaseLibp2pError, OSError, EOFError):
            return


async def reset_quietly(stream: Any) -> None:
    with (
        trio.CancelScope(shield=True),
        trio.move_on_after(1),
        contextlib.suppress(BaseLibp2pError, OSError),
    ):
        await stream.reset()


async def close_quietly(stream: Any) -> None:
    with (
        trio.CancelScope(shield=True),
        trio.move_on_after(1),
        contextlib.suppress(BaseLibp2pError, OSError),
    ):
        await stream.close()
