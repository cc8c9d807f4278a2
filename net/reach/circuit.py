"""Circuit relay, the wire side both ends share: a peer that cannot be dialled (behind NAT)
is reached through a public peer that it keeps a connection to.

The wire format is libp2p's circuit relay v2 (``/libp2p/circuit/relay/0.2.0/hop`` and
``/stop``, its protobuf messages from py-libp2p), so the roles and codes are the spec's;
the relay (net/reach/relay.py) and its client (net/reach/relay_client.py) are ours
(docs/decisions/007). Here: the protocol ids, the length-prefixed messages (also DCUtR's
framing), circuit addresses, and

- **Dialling** (:func:`dial_relayed`): open a circuit through the relay and run the
  usual Noise + Yamux upgrade over it. The relay sees only ciphertext, and Noise checks
  the far end's peer id, so a relay can break a connection but never read or alter it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import multiaddr
import trio
from google.protobuf.message import Message
from libp2p.connection_types import ConnectionType
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeer
from libp2p.relay.circuit_v2.pb.circuit_pb2 import Status as Code

from net._libp2p import PeerID
from net.transport.host import DialError, SwarmHost, parse_peer_addr

log = logging.getLogger(__name__)

HOP = "/libp2p/circuit/relay/0.2.0/hop"
STOP = "/libp2p/circuit/relay/0.2.0/stop"
#: The longest hop or stop message we read (a few addresses and ids).
MAX_MESSAGE_BYTES = 4096


class RelayError(DialError):
    """A relay refused or failed a reservation or a circuit."""


# ------------------------------------------------------------------ messages


async def write_message(stream: Any, message: Message) -> None:
    """One length-prefixed protobuf message (the relay's and DCUtR's framing)."""
    body = message.SerializeToString()
    await stream.write(_varint(len(body)) + body)


async def read_message(stream: Any, kind: type[Any]) -> Any:
    """One length-prefixed protobuf message, read byte by byte up to its end (the bytes
    after it belong to the circuit); bounded before anything is allocated."""
    length = 0
    for shift in range(0, 35, 7):
        byte = await _read_exactly(stream, 1)
        length |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            break
    else:
        raise RelayError("malformed message length")
    if length > MAX_MESSAGE_BYTES:
        raise RelayError(f"a relay message of {length} bytes (the limit is {MAX_MESSAGE_BYTES})")
    message = kind()
    try:
        message.ParseFromString(await _read_exactly(stream, length))
    except Exception as exc:  # protobuf's DecodeError and friends
        raise RelayError(f"malformed relay message: {exc}") from exc
    return message


async def _read_exactly(stream: Any, n: int) -> bytes:
    data = b""
    while len(data) < n:
        try:
            chunk = await stream.read(n - len(data))
        except EOFError:
            chunk = b""
        if not chunk:
            raise RelayError("the stream ended inside a relay message")
        data += chunk
    return data


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _status(code: Any) -> str:
    try:
        return str(Code.Name(code))
    except ValueError:
        return str(code)


def circuit_addr(relay_addr: str, relay: PeerID) -> str:
    """The address a peer reserved on ``relay`` announces (without its own /p2p/)."""
    return f"{relay_addr.split('/p2p/', 1)[0]}/p2p/{relay}/p2p-circuit"


def split_circuit(addr: str) -> tuple[str, PeerID] | None:
    """``<relay address>/p2p/<relay>``, and the relay's id, of a circuit address; None
    when ``addr`` is not one."""
    head, sep, _ = addr.partition("/p2p-circuit")
    if not sep or "/p2p/" not in head:
        return None
    try:
        info = parse_peer_addr(head)
    except ValueError:
        return None
    return head, info.peer_id


async def reset_quietly(stream: Any) -> None:
    """Reset a stream that may be gone already (relay and hole-punch streams)."""
    with (
        trio.CancelScope(shield=True),
        trio.move_on_after(1),
        contextlib.suppress(Exception),  # already gone
    ):
        await stream.reset()


def seen_ip(peer: Any) -> str | None:
    """The IPv4 address a relay said it saw a peer at (a circuit message's ``peer``)."""
    for raw in list(getattr(peer, "addrs", []))[:1]:
        addr = _readable_addr(raw)
        parts = (addr or "").split("/")
        if len(parts) == 3 and parts[1] == "ip4":
            return parts[2]
    return None


def _readable_addr(raw: bytes) -> str | None:
    try:
        return str(multiaddr.Multiaddr(raw))
    except Exception as exc:  # noqa: BLE001 - an address we cannot read is skipped
        log.debug("unreadable relay address: %s", exc)
        return None


# ------------------------------------------------------------------ dialling


async def dial_relayed(host: SwarmHost, target: PeerID, circuit: str, timeout: float) -> Any:
    """A connection to ``target`` through the relay named in ``circuit``; raises
    :class:`RelayError` (or DialError) when the relay refuses or cannot be reached."""
    parsed = split_circuit(circuit)
    if parsed is None:
        raise RelayError(f"{circuit!r} is not a relay circuit address")
    relay_addr, relay = parsed
    if relay in (target, host.peer_id):
        raise RelayError("a circuit through the target itself or through us")
    with trio.fail_after(timeout):
        await host.connect(relay, [relay_addr.split("/p2p/", 1)[0]], timeout=timeout, attempts=1)
        stream = await host.new_stream(relay, HOP, timeout=timeout, attempts=1)
        try:
            await write_message(
                stream,
                HopMessage(type=HopMessage.CONNECT, peer=CircuitPeer(id=target.to_bytes())),
            )
            answer = await read_message(stream, HopMessage)
            if answer.type != HopMessage.STATUS or answer.status != Code.OK:
                raise RelayError(f"relay {relay} refused the circuit: {_status(answer.status)}")
            host.note_seen_by_relay(target, seen_ip(answer.peer))
            addr = multiaddr.Multiaddr(f"{circuit}/p2p/{target}")
            raw = RawConnection(stream, True, ConnectionType.RELAYED, [addr])
            return await host.libp2p_host.upgrade_outbound_connection(raw, target)
        except BaseException:
            await reset_quietly(stream)
            raise
