"""Which of a peer's addresses to dial, in what order, and dialling them one after
another until one answers.

py-libp2p 0.8.1's ``Swarm.dial_peer`` dials *one* TCP address per peer (its "smart
address selection" keeps one per transport class) in the peerstore's order, and it took
the addresses a peer announced in Identify as they came: ``/ip4/0.0.0.0/tcp/4001`` from a
peer listening on every interface. Dialling 0.0.0.0 reaches our own listener, the Noise
handshake fails, and the peer counts as unreachable although its real address was one
line below (measured in the lab: a home peer whose router changed its address stayed cut
off from every public peer for about two minutes; docs/decisions/007-reachability.md).
So we order the addresses ourselves and dial each in turn.
"""

from __future__ import annotations

import ipaddress
import logging
import random
from collections.abc import Collection, Sequence

from net.transport.admission import source_of

log = logging.getLogger(__name__)

#: A peer's record may name many addresses; a dial tries at most this many.
MAX_DIAL_ADDRS = 8
#: ... and at most this many ports of one IP address (a peer that restarted may have a
#: few, old ones first; a record naming many aims our dials at whoever is there).
MAX_PORTS_PER_IP = 4
#: The next address is dialled when the previous one failed, or after this long
#: (Happy Eyeballs: a silent address must not hold back the next one for a whole
#: connect timeout).
STAGGER_S = 0.3
#: Relay circuits are dialled once every direct address failed, or after this long: a
#: direct connection is faster and costs no relay anything.
CIRCUIT_AFTER_S = 1.0
CIRCUIT_TIMEOUT_S = 10.0


def dial_order(addrs: Sequence[str], own: Collection[str] = ()) -> list[str]:
    """The addresses worth dialling, best first (a pure function: see its table test).

    Left out: addresses that cannot name a peer (the unspecified ``0.0.0.0`` / ``::``,
    which reach whoever dials), our own listen addresses (``own``: the dial would reach
    us), relay circuits (dialled by the relay client, not here), duplicates, and ports of
    an IP address past the first MAX_PORTS_PER_IP. The
    peer's own order is kept (it puts what outsiders reached first), except that loopback
    goes last: it reaches a peer only on this same computer."""
    usable: list[str] = []
    loopback: list[str] = []
    seen: set[str] = set()
    per_ip: dict[str, int] = {}
    own_set = set(own)
    for addr in addrs:
        base = addr.split("/p2p/", 1)[0]
        if base in seen or base in own_set or "/p2p-circuit" in addr:
            continue
        seen.add(base)
        parts = base.split("/")
        if len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
            usable.append(base)  # dns and the like: left to the transport
            continue
        try:
            ip = ipaddress.ip_address(parts[2])
        except ValueError:
            continue
        if ip.is_unspecified or ip.is_multicast:
            continue
        # a peer listens on a port or two of an address; a record naming many ports
        # of one address aims our dials at whoever is there
        per_ip[str(ip)] = per_ip.get(str(ip), 0) + 1
        if per_ip[str(ip)] > MAX_PORTS_PER_IP:
            continue
        (loopback if ip.is_loopback else usable).append(base)
    return [*usable, *loopback][:MAX_DIAL_ADDRS]


def relayed_candidates(addrs: Sequence[str]) -> list[str]:
    """The relay circuits among ``addrs`` (``<relay address>/p2p/<relay>/p2p-circuit``),
    in a random order that spreads a peer's callers over its relays, at most 4."""
    marker = "/p2p-circuit"
    circuits = [a.split(marker, 1)[0] + marker for a in addrs if marker in a]
    unique = list(dict.fromkeys(circuits))
    random.shuffle(unique)
    return unique[:4]


def address_source(addr: str) -> str | None:
    """The source (net.transport.admission.source_of: IPv4 address, IPv6 /64) an ``/ip4`` or
    ``/ip6`` address dials; None for anything else (dns names prove nothing)."""
    parts = addr.split("/")
    if len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        return None
    try:
        ipaddress.ip_address(parts[2])
    except ValueError:
        return None
    return source_of(parts[2])


def proven_addrs(claimed: Sequence[str], source: str) -> tuple[str, ...]:
    """The addresses a peer claims that its connection proves: those on the address
    (IPv4) or network (IPv6 /64) the connection came from. A peer that came through a
    relay proves that relay's circuits. Anything else is the peer's word, which a
    stranger uses to aim others' dials at a third party (issue 35: 60 DHT requests
    naming 8 ports of a third party brought 5,659 connections on it)."""
    return tuple(a for a in claimed if address_source(a) == source)


def circuit_relay(addr: str) -> tuple[str, str] | None:
    """(source of the relay's address, the relay's id) of a relay circuit address
    ``/ip4/<relay ip>/tcp/<port>/p2p/<relay id>/p2p-circuit...``; None for any other."""
    head, sep, _ = addr.partition("/p2p-circuit")
    if not sep or "/p2p/" not in head:
        return None
    base, _, relay_id = head.rpartition("/p2p/")
    where = address_source(base)
    if where is None or not relay_id or "/" in relay_id:
        return None
    return where, relay_id
