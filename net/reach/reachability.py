"""Can others dial us? Learned from dial-backs by other peers, never guessed from our
own interfaces (a home computer's addresses say nothing of the NAT in front of it).

The exchange (AutoNAT's idea, over our RPC; py-libp2p 0.8.1's AutoNAT never dials back,
see docs/decisions/007-reachability.md):

1. A node asks a few peers it is connected to: "dial me back on these ports".
2. Each of them takes the address the request *came from* (never an address the
   requester names, so nobody can be made to dial a third party), dials back from a
   separate identity (a new connection is made, not the one already open) and answers
   what it observed and which ports answered the Noise handshake with the requester's
   peer id.
3. The node judges the answers (:func:`judge`): reachable when a peer got through,
   unreachable when at least two peers failed and none got through, unknown otherwise.
   It asks again every few minutes, and soon when the observed address changes (a new
   address from the provider, another network).

Answers are a peer's word, and peers are free identities (issue 35: a volunteer behind
NAT was told it was public at an address an attacker chose, and a relay put such an
address into its own signed record). So a port counts as reachable only when the
peer's dialer (its identity is in the answer) really came in on it, directly; and our
public address is taken only from two sources (peers at different addresses) that
agree, or when it is one of our own interfaces' addresses.

Reachable nodes announce ``/ip4/<observed>/tcp/<port>`` first, so a peer outside their
LAN dials what works.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

import trio

from net._libp2p import PeerID
from net.identity import Identity
from net.ratelimit import Admission, PeerRateLimiter, RateLimits
from net.rpc import BadRequest, CallContext, RateLimited, Reply, RpcError, RpcService
from net.transport.host import DialError, SwarmHost, interface_addresses

log = logging.getLogger(__name__)

#: RPC method: "dial me back" (meta: {"ports": [int, ...]}); with no ports, only "what
#: address do you see me at?", which is how a node notices that its network changed.
DIAL_BACK = "net.dial_back"


#: Peers that answered from outside, remembered to be asked again.
_MAX_OBSERVERS = 8


class Reachability(enum.Enum):
    UNKNOWN = "unknown"
    PUBLIC = "public"  # peers outside dialled us back
    PRIVATE = "private"  # peers outside could not (NAT, firewall)


@dataclass(frozen=True)
class ReachabilityConfig:
    #: peers asked in each round
    servers_per_round: int = 3
    #: seconds between rounds once the answer is known (and while it is not)
    recheck_s: float = 300.0
    unknown_recheck_s: float = 15.0
    #: seconds between asking one peer which address it sees (no dial-back): a new
    #: address starts a round at once
    observe_s: float = 30.0
    #: one dial-back may take this long
    dial_timeout_s: float = 5.0
    #: a request names at most this many ports
    max_ports: int = 4
    #: dial-backs per requesting IP: a burst, then one per this many seconds
    per_ip_burst: int = 3
    per_ip_every_s: float = 10.0
    #: dial-backs in flight, all requesters together
    max_concurrent: int = 8


@dataclass(frozen=True)
class DialBackAnswer:
    """What one peer reported: the address our request came from, and whether it could
    dial us back on each port."""

    server: PeerID
    observed_ip: str
    #: the ports the server's dialer was seen to come in on (its word alone: none)
    reachable_ports: tuple[int, ...]
    tried_ports: tuple[int, ...]
    #: the address (net.transport.admission.source_of) the server answered from, as we see it
    source: str = "?"


@dataclass(frozen=True)
class Verdict:
    reachability: Reachability
    #: our public IPv4 address as peers see it (most reported), if any peer answered
    observed_ip: str | None
    #: addresses peers dialled us back on
    public_addrs: tuple[str, ...]


def most_reported(answers: Sequence[DialBackAnswer]) -> tuple[str | None, int]:
    """The address most sources (peers at distinct addresses) saw us at, and how many."""
    sources: dict[str, set[str]] = {}
    for a in answers:
        sources.setdefault(a.observed_ip, set()).add(a.source)
    if not sources:
        return None, 0
    observed = max(sorted(sources), key=lambda ip: len(sources[ip]))
    return observed, len(sources[observed])


def judge(
    answers: Sequence[DialBackAnswer],
    own_ips: Collection[str] = (),
    *,
    min_failures: int = 2,
    min_sources: int = 2,
) -> Verdict:
    """The verdict of one round of answers (a pure function: see its table test).

    One verified dial-back is proof enough that we can be reached (its dialer came in,
    and the requester's peer id was checked by the handshake). The address we are seen
    at is a peer's word: it is taken when ``min_sources`` sources (distinct addresses)
    report it, or when it is one of our own (``own_ips``); else the verdict is UNKNOWN
    and no address is announced. Failures need ``min_failures`` distinct peers, since
    one peer's own network may be what failed. Peers that saw us at one of our own
    interface addresses share our network, or we have no NAT: when other peers saw us
    at another address (through a NAT), only those others speak for the internet, and a
    neighbour on the LAN who got through proves nothing."""
    outside = [a for a in answers if a.observed_ip not in own_ips]
    if outside:
        answers = outside
    observed, sources = most_reported(answers)
    if observed is None:
        return Verdict(Reachability.UNKNOWN, None, ())
    if observed not in own_ips and sources < min_sources:
        return Verdict(Reachability.UNKNOWN, None, ())
    ok = sorted({p for a in answers if a.observed_ip == observed for p in a.reachable_ports})
    if ok:
        addrs = tuple(f"/ip4/{observed}/tcp/{port}" for port in ok)
        return Verdict(Reachability.PUBLIC, observed, addrs)
    failed_servers = {a.server for a in answers if a.tried_ports}
    if len(failed_servers) >= min_failures:
        return Verdict(Reachability.PRIVATE, observed, ())
    return Verdict(Reachability.UNKNOWN, observed, ())


def pool_answers(
    recent: Mapping[PeerID, tuple[float, DialBackAnswer]],
    answers: Sequence[DialBackAnswer],
    now: float,
    window_s: float,
    own_ips: Collection[str] = (),
) -> dict[PeerID, tuple[float, DialBackAnswer]]:
    """The answers to judge: each peer's latest (with when it came), this round's added,
    those older than ``window_s`` dropped, and those that saw us at another address than
    this round did dropped too (they speak of a network we left)."""
    pooled = dict(recent)
    for a in answers:
        pooled[a.server] = (now, a)
    outside = [a for a in answers if a.observed_ip not in own_ips]
    current, _ = most_reported(outside or answers)
    return {
        server: (when, a)
        for server, (when, a) in pooled.items()
        if now - when <= window_s and (a.observed_ip == current or a.observed_ip in own_ips)
    }


def tcp_ports(addrs: Sequence[str]) -> list[int]:
    """The TCP ports of our IPv4 listen addresses."""
    ports = []
    for addr in addrs:
        parts = addr.split("/")
        if len(parts) >= 5 and parts[1] == "ip4" and parts[3] == "tcp" and parts[4].isdigit():
            ports.append(int(parts[4]))
    return sorted(set(ports))


class DialBackService:
    """The server side: answers DIAL_BACK requests of other peers."""

    def __init__(
        self,
        rpc: RpcService,
        config: ReachabilityConfig | None = None,
        *,
        dialer: SwarmHost | None = None,
    ) -> None:
        self.config = config or ReachabilityConfig()
        self._rpc = rpc
        # a host of its own, with a throwaway identity and no listener: its dial makes a
        # new connection, where one under our own id would reuse the requester's
        self._dialer = dialer or SwarmHost(Identity.generate(), [])
        self._per_ip: PeerRateLimiter[str] = PeerRateLimiter(
            RateLimits(
                requests_per_second=1.0 / self.config.per_ip_every_s,
                request_burst=self.config.per_ip_burst,
                max_peers=4096,
            )
        )
        self._slots = trio.Semaphore(self.config.max_concurrent)
        self.served = 0
        self.refused = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with self._dialer.running():
            self._rpc.register(DIAL_BACK, self._handle)
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                self._rpc.unregister(DIAL_BACK)

    async def _handle(self, ctx: CallContext) -> Reply:
        ports = ctx.request.meta.get("ports")
        if (
            not isinstance(ports, list)
            or len(ports) > self.config.max_ports
            or not all(_is_port(p) for p in ports)
        ):
            self.refused += 1
            raise BadRequest(f"ports: at most {self.config.max_ports} TCP port numbers")
        try:
            ip = ipaddress.IPv4Address(ctx.source)  # an IPv6 source is a /64: refused too
        except ValueError:
            self.refused += 1
            raise BadRequest("dial-backs are made to IPv4 requesters only") from None
        # only dial-backs cost a budget: "where do you see me?" costs one exchange, and
        # a node that lost its address asks it of every peer it knows
        if ports and self._per_ip.admit(ctx.source, 0, trio.current_time()) is not Admission.ADMIT:
            self.refused += 1
            raise RateLimited("too many dial-back requests from this address; ask later")
        reachable = []
        async with self._slots:
            for port in sorted(set(ports)):
                if await self._dial_back(ctx.peer_id, f"/ip4/{ip}/tcp/{port}"):
                    reachable.append(port)
        self.served += 1
        return Reply(
            {
                "observed": str(ip),
                "reachable": reachable,
                "tried": sorted(set(ports)),
                # who dialled: the requester believes a port only if this peer came in
                "dialer": self._dialer.peer_id.to_bytes(),
            }
        )

    async def _dial_back(self, peer_id: PeerID, addr: str) -> bool:
        # each dial-back is a real dial: an earlier failure (the same peer behind its
        # NAT a minute ago) must not answer for this one
        self._dialer.forget_failures(peer_id)
        try:
            await self._dialer.connect(
                peer_id, [addr], timeout=self.config.dial_timeout_s, attempts=1
            )
        except DialError as exc:
            log.debug("dial-back to %s at %s failed: %s", peer_id, addr, exc)
            return False
        await self._dialer.disconnect(peer_id)
        return True


@dataclass
class ReachabilityMonitor:
    """The client side: asks peers to dial us back, round after round, and keeps the
    verdict up to date. ``on_change`` is told each new verdict."""

    rpc: RpcService
    host: SwarmHost
    config: ReachabilityConfig = field(default_factory=ReachabilityConfig)
    on_change: Callable[[Verdict], None] | None = None
    verdict: Verdict = field(default_factory=lambda: Verdict(Reachability.UNKNOWN, None, ()))
    rounds: int = 0
    #: ports to be dialled back on besides our listeners' (those a router forwards)
    extra_ports: list[int] = field(default_factory=list)
    _recheck: trio.Event = field(default_factory=trio.Event)
    #: peers outside our network that answered the last round
    _observers: list[PeerID] = field(default_factory=list)
    #: the latest answer of each peer, and when it came
    _recent: dict[PeerID, tuple[float, DialBackAnswer]] = field(default_factory=dict)

    def recheck_soon(self) -> None:
        """Ask again now (e.g. the network changed)."""
        self._recheck.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_address)
            task_status.started()
            await self._rounds()

    async def _watch_address(self) -> None:
        """Every ``observe_s``: ask a peer where it sees us from; a changed address (a
        new one from the provider, a move to another network) means a new round now.

        Peers that answered before are asked first, connected or not: after a change of
        address every connection may be dead, and waiting for a new one would take
        minutes."""
        while True:
            await trio.sleep(self.config.observe_s)
            known = self.verdict.observed_ip
            if known is None:
                continue
            connected = self.host.connected_peers()
            random.shuffle(connected)
            candidates = list(dict.fromkeys([*self._observers, *connected]))
            for peer in candidates[:3]:
                was_connected = self.host.is_connected(peer)
                answer = await self._ask(peer, [], dial_attempts=2)
                if answer is None and was_connected:
                    # a connection that cannot carry a short question is dead, most
                    # likely with our old address: drop it and ask over a new one
                    await self.host.disconnect(peer)
                    answer = await self._ask(peer, [], dial_attempts=2)
                if answer is None:
                    continue
                if answer.observed_ip in interface_addresses():
                    continue  # a neighbour on our own network
                if answer.observed_ip != known:
                    log.info("seen from a new address (%s, was %s)", answer.observed_ip, known)
                    self.recheck_soon()
                break

    async def _rounds(self) -> None:
        while True:
            await self.check_once()
            wait = (
                self.config.unknown_recheck_s
                if self.verdict.reachability is Reachability.UNKNOWN
                else self.config.recheck_s
            )
            with trio.move_on_after(wait):
                await self._recheck.wait()
            self._recheck = trio.Event()

    async def check_once(self) -> Verdict:
        """One round: ask up to ``servers_per_round`` peers at once, those that answered
        from outside last time first (connected or not: after a change of network the
        old connections may all be dead), then connected ones."""
        ports = list(dict.fromkeys([*tcp_ports(self.host.listen_addrs()), *self.extra_ports]))
        ports = ports[: self.config.max_ports]
        connected = self.host.connected_peers()
        random.shuffle(connected)
        peers = list(dict.fromkeys([*self._observers, *connected]))
        answers: list[DialBackAnswer] = []
        if ports and peers:

            async def ask(peer: PeerID) -> None:
                answer = await self._ask(peer, ports, dial_attempts=2)
                if answer is not None:
                    answers.append(answer)

            async with trio.open_nursery() as nursery:
                for peer in peers[: self.config.servers_per_round]:
                    nursery.start_soon(ask, peer)
        self.rounds += 1
        if not answers:
            return self.verdict  # nothing learned
        own = interface_addresses()
        # Answers add up over rounds, the latest of each peer counting (peers limit how
        # often they dial back, so one round may hear from one peer only), as long as
        # they are recent and saw us at the address this round saw.
        self._recent = pool_answers(
            self._recent, answers, trio.current_time(), self.config.recheck_s, own
        )
        pool = [a for _, a in self._recent.values()]
        # peers that saw us from outside are remembered (a few, newest first): after a
        # change of network they are the ones to ask, connected or not
        outside = [a.server for a in answers if a.observed_ip not in own]
        self._observers = list(dict.fromkeys([*outside, *self._observers]))[:_MAX_OBSERVERS]
        verdict = judge(pool, own_ips=own)
        # too few answers this round: keep what we knew, unless our address changed
        if (
            verdict.reachability is Reachability.UNKNOWN
            and self.verdict.reachability is not Reachability.UNKNOWN
            and verdict.observed_ip in (None, self.verdict.observed_ip)
        ):
            return self.verdict
        if verdict != self.verdict:
            log.info(
                "reachability: %s (seen as %s)", verdict.reachability.value, verdict.observed_ip
            )
            self.verdict = verdict
            if self.on_change is not None:
                self.on_change(verdict)
        return verdict

    async def _ask(
        self, peer: PeerID, ports: list[int], *, dial_attempts: int = 1
    ) -> DialBackAnswer | None:
        # a dial-back takes up to dial_timeout_s per port; a bare question, one exchange
        timeout = self.config.dial_timeout_s * (len(ports) + 1)
        asked = trio.current_time()
        try:
            reply = await self.rpc.call(
                peer, DIAL_BACK, {"ports": ports}, timeout=timeout, dial_attempts=dial_attempts
            )
        except RpcError as exc:
            log.debug("dial-back request to %s failed: %s", peer, exc)
            return None
        answer = _answer(peer, reply.meta, ports, self.host.source_of_peer(peer) or "?")
        if answer is None or not answer.reachable_ports:
            return answer
        # believed only if its dialer came in (the answer may overtake its arrival)
        dialer = _peer_id(reply.meta.get("dialer"))
        port = None if dialer is None else await self.host.arrival(dialer, asked, 2.0)
        proven = tuple(p for p in answer.reachable_ports if port in (p, -1))
        if proven == answer.reachable_ports:
            return answer
        log.info("%s says it dialled us back, but nobody came in: not believed", peer)
        # neither a success nor a failure: a liar's word must not turn a public node
        # private either
        unproven = set(answer.reachable_ports) - set(proven)
        tried = tuple(p for p in answer.tried_ports if p not in unproven)
        return replace(answer, reachable_ports=proven, tried_ports=tried)


def _peer_id(raw: object) -> PeerID | None:
    if not isinstance(raw, bytes) or len(raw) > 64:
        return None
    try:
        return PeerID(raw)
    except Exception:  # noqa: BLE001 - a malformed id from a peer: not believed
        return None


def _answer(
    peer: PeerID, meta: Mapping[str, object], asked: list[int], source: str = "?"
) -> DialBackAnswer | None:
    """A peer's answer, checked: an answer that is not well formed is ignored."""
    observed, reachable, tried = meta.get("observed"), meta.get("reachable"), meta.get("tried")
    if not isinstance(observed, str) or not isinstance(reachable, list):
        return None
    if not isinstance(tried, list):
        return None
    try:
        ip = ipaddress.IPv4Address(observed)
    except ValueError:
        return None
    ports = tuple(p for p in reachable if isinstance(p, int) and p in asked)
    tried_ports = tuple(p for p in tried if isinstance(p, int) and p in asked)
    return DialBackAnswer(peer, str(ip), ports, tried_ports, source)


def _is_port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536
