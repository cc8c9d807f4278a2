"""Memory a stranger makes a node hold (issue 14, findings 4-5): by arrival, never by
declaration, within a share per peer and per address, and let go of when a sender
stalls."""

from __future__ import annotations

import contextlib
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import psutil
import pytest
import trio

from net.identity import Identity
from net.rpc import Reply, RpcConfig, RpcService
from net.rpc.frames import Tensor
from net.transport.host import SwarmHost
from tests.strangers import frame, rpc_server, send_raw, stranger
from tests.waiting import eventually

MiB = 1024 * 1024


async def echo(ctx):
    return Reply({"n": sum(t.nbytes for t in ctx.request.tensors)})


def echo_server(
    config: RpcConfig | None = None,
) -> AbstractAsyncContextManager[tuple[SwarmHost, RpcService]]:
    return rpc_server(echo, config)


@asynccontextmanager
async def honest_client(server: SwarmHost):
    host = SwarmHost(Identity.generate(), listen=[])
    async with host.running():
        host.remember(server.peer_id, server.listen_addrs())
        yield RpcService(host)


def rss() -> int:
    return psutil.Process().memory_info().rss


async def test_streams_declaring_256_mib_and_sending_nothing_hold_no_memory():
    """Four ~60-byte frames used to take 1 GiB (allocated and zero-filled at once) and
    refuse every data-carrying call as Overloaded for up to 300 s."""
    config = RpcConfig(stall_seconds=2.0)
    async with echo_server(config) as (server, rpc), stranger() as attacker:
        before = rss()
        streams = []
        for i in range(4):
            header = {"id": i + 1, "m": "echo", "t": [["uint8", [256 * MiB]]]}
            streams.append(await send_raw(attacker, server, frame(header)))
        async with honest_client(server) as client:
            for _ in range(10):
                payload = Tensor("uint8", (MiB,), bytes(MiB))
                reply = await client.call(server.peer_id, "echo", tensors=[payload], timeout=10)
                assert reply.meta == {"n": MiB}
        assert rss() - before < 100 * MiB
        # the silent senders are cut off after the stall deadline, holding nothing
        await eventually(lambda: rpc.stats.rejected["stalled"] == 4, timeout=15)
        assert rpc.buffered_bytes() == 0


async def test_payload_memory_is_taken_as_bytes_arrive_within_the_senders_share():
    """A crowd of identities from one address shares that address's share: peers
    elsewhere keep the rest of the budget."""
    config = RpcConfig(max_buffered_bytes=64 * MiB, stall_seconds=5.0)
    async with echo_server(config) as (server, rpc), trio.open_nursery() as nursery:
        sent = []

        async def trickle(i: int) -> None:
            # 8 identities from one address each declare 8 MiB and send 4 MiB of it
            async with stranger("127.0.0.3") as attacker:
                header = {"id": 1, "m": "echo", "t": [["uint8", [8 * MiB]]]}
                with contextlib.suppress(Exception):  # refused ones are reset mid-write
                    await send_raw(attacker, server, frame(header, bytes(4 * MiB)))
                sent.append(i)
                await trio.sleep_forever()

        for i in range(8):
            nursery.start_soon(trickle, i)
        # the address's share is a quarter of the budget: at most 16 MiB held for it
        await eventually(lambda: len(sent) == 8)
        await eventually(lambda: rpc.stats.rejected["memory"] >= 4)
        assert rpc.buffered_bytes() <= 16 * MiB
        async with honest_client(server) as client:
            payload = Tensor("uint8", (8 * MiB,), bytes(8 * MiB))
            for _ in range(3):
                reply = await client.call(server.peer_id, "echo", tensors=[payload], timeout=10)
                assert reply.meta == {"n": 8 * MiB}
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_refused_requests_that_stall_hold_no_memory():
    """A refused request used to keep a 1 MiB scratch buffer while its sender stalled:
    2000 streams from 10 identities added 2 GiB, outside every budget."""
    config = RpcConfig(stall_seconds=3.0)
    async with echo_server(config) as (server, rpc), contextlib.AsyncExitStack() as stack:
        before = rss()
        streams = []
        for source in range(4):
            attacker = await stack.enter_async_context(stranger(f"127.0.0.{20 + source}"))
            for i in range(60):
                # an unknown method is refused from its header; the payload never comes
                header = {"id": i + 1, "m": "nope", "t": [["uint8", [2 * MiB]]]}
                streams.append(await send_raw(attacker, server, frame(header)))
        assert rss() - before < 60 * MiB
        async with honest_client(server) as client:
            reply = await client.call(server.peer_id, "echo", {"x": 1}, timeout=10)
            assert reply.meta == {"n": 0}
        # the attackers are still there, silent: their streams are cut off, and each
        # address, having stalled again and again, is banned (its connections closed)
        await eventually(lambda: server.streams.open_streams() < 10, timeout=30)
        assert rpc.stats.rejected["stalled"] >= 4 * 21
        assert server.admission_statistics().bans == 4
