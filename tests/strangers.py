"""What the hostile tests and benchmarks/hostile.py use to play a stranger on 127.0.0.1.

A stranger on the internet comes from an address of its own. Loopback has 2**24 of them
(127.0.0.0/8), so an attacker here binds its sockets to 127.0.0.x and honest peers keep
127.0.0.1: per-address limits then see what they would see on the internet.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from net.identity import Identity
from net.rpc import RPC_PROTOCOL, RpcConfig, RpcService
from net.testing import count_connections, dial_from, raw_frame
from net.transport.host import SwarmHost


@asynccontextmanager
async def stranger(source_ip: str = "127.0.0.2") -> AsyncIterator[SwarmHost]:
    """A running host with a fresh identity that dials from ``source_ip`` and listens
    nowhere (an attacker needs no listener)."""
    host = dial_from(SwarmHost(Identity.generate(), listen=[]), source_ip)
    async with host.running():
        yield host


@asynccontextmanager
async def rpc_server(
    handler: Any, config: RpcConfig | None = None
) -> AsyncIterator[tuple[SwarmHost, RpcService]]:
    """A host on 127.0.0.1 whose RPC service answers "echo" with ``handler``."""
    host = SwarmHost(Identity.generate())
    async with host.running():
        rpc = RpcService(host, config)
        rpc.register("echo", handler)
        rpc.attach()
        try:
            yield host, rpc
        finally:
            rpc.close()


def tcp_target(host: SwarmHost) -> tuple[str, int]:
    """(ip, port) of a host's first TCP listen address."""
    parts = host.listen_addrs()[0].split("/")
    return parts[2], int(parts[4])


async def open_raw_socket(target: tuple[str, int], source_ip: str) -> trio.SocketStream:
    """A TCP connection that will never say a word."""
    sock = trio.socket.socket()
    await sock.bind((source_ip, 0))
    await sock.connect(target)
    return trio.SocketStream(sock)


frame = raw_frame


async def send_raw(client: SwarmHost, server: SwarmHost, data: bytes) -> Any:
    """Open an RPC stream, write ``data``, return the stream (the caller reads or resets)."""
    client.remember(server.peer_id, server.listen_addrs())
    stream = await client.new_stream(server.peer_id, RPC_PROTOCOL)
    await stream.write(data)
    return stream


async def hold_sockets(
    target: tuple[str, int],
    count: int,
    source_ip: str,
    *,
    reopen: bool = True,
    task_status: trio.TaskStatus[list[int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep ``count`` idle sockets open to ``target`` until cancelled, reopening each as
    soon as the target closes it (unless ``reopen`` is False). Reports a one-item list
    counting the sockets the target closed."""
    reopened = [0]

    async def one(started: trio.Event | None) -> None:
        while True:
            try:
                stream = await open_raw_socket(target, source_ip)
            except OSError:
                await trio.sleep(0.01)
                continue
            if started is not None:
                started.set()
                started = None
            async with stream:
                try:
                    while await stream.receive_some(4096):
                        pass  # whatever the target says, say nothing back
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            reopened[0] += 1
            if not reopen:
                return

    async with trio.open_nursery() as nursery:
        events = [trio.Event() for _ in range(count)]
        for event in events:
            nursery.start_soon(one, event)
        for event in events:
            await event.wait()
        task_status.started(reopened)


__all__: Sequence[str] = [
    "count_connections",
    "dial_from",
    "frame",
    "hold_sockets",
    "open_raw_socket",
    "send_raw",
    "stranger",
    "tcp_target",
]
