"""Which server of an expert to call: the one expected to answer first.

An expert is served by several volunteers, and one volunteer serves several experts (of
both mixture layers): work sent to a busy volunteer waits behind its queue while another
sits idle. Choosing at random (or by past latency, which lags) leaves a swarm of slow
volunteers half idle: measured in the emulated swarm (core/demo/emulated.py), 4
volunteers, 4 batches in flight: 0.71 of their capacity used.

So the trainer keeps, per server, what it knows of its backlog: the work it sent there
and has no answer for yet, the queue the server reported with its last answer (decayed
since, at the server's own rate), and that rate (work units per second, as the server
measured it). A call goes to the server whose backlog, plus the call itself, is done
first. Work is counted in *units*: one row of a forward pass is 1, of a backward pass 2.

The link counts too: a volunteer 250 ms away answers 250 ms later whatever its queue
(ranking by backlog alone sent such volunteers as much work as near ones: a red CI;
tests/processes/test_emulated_swarm.py holds it now). Each answer
says how long the call spent at the server (``seconds``: waiting and computing); the
rest of the call's time, as the caller measured it, is the link's *overhead*, smoothed
per server and added to its finish time.

Pure bookkeeping, no I/O: the caller tells it what it sent and what came back.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

#: Units of work per row: a backward pass costs about twice a forward pass.
FORWARD_UNITS = 1.0
BACKWARD_UNITS = 2.0

K = TypeVar("K", bound=Hashable)


@dataclass
class _Server:
    outstanding: float = 0.0
    #: queue at the server when it last answered, and when (caller's clock)
    reported_queue: float = 0.0
    reported_at: float = 0.0
    rate: float | None = None
    #: seconds a call spends outside the server (links, transfers), smoothed
    overhead: float | None = None


@dataclass
class ServerLoads:
    """The trainer's view of each server's backlog (shared by all its mixture layers:
    a volunteer's device is one, whatever layer a call is for)."""

    _servers: dict[Hashable, _Server] = field(default_factory=dict)

    def sent(self, server: Hashable, units: float) -> None:
        self._servers.setdefault(server, _Server()).outstanding += units

    def ended(
        self,
        server: Hashable,
        units: float,
        now: float,
        *,
        queue: float | None = None,
        rate: float | None = None,
        elapsed: float | None = None,
        seconds: float | None = None,
    ) -> None:
        """A call of ``units`` to ``server`` ended (answered or not); ``queue``,
        ``rate`` and ``seconds``: what the answer said of the server's backlog, speed
        and time spent on this call; ``elapsed``: the call's time as the caller saw it."""
        s = self._servers.setdefault(server, _Server())
        s.outstanding = max(0.0, s.outstanding - units)
        if queue is not None and queue >= 0:
            s.reported_queue, s.reported_at = queue, now
        if rate is not None and rate > 0:
            s.rate = rate if s.rate is None else 0.7 * s.rate + 0.3 * rate
        if elapsed is not None and seconds is not None and elapsed >= 0 and seconds >= 0:
            # a server that claims more time than the call took gets no overhead, not less
            sample = max(0.0, elapsed - seconds)
            s.overhead = sample if s.overhead is None else 0.7 * s.overhead + 0.3 * sample

    def finish_time(self, server: Hashable, units: float, now: float) -> float:
        """Seconds until ``server`` would be done with a call of ``units`` sent now."""
        s = self._servers.get(server) or _Server()
        rate = s.rate or self._typical_rate()
        if rate is None:
            return s.outstanding + units  # nothing measured yet: spread by work alone
        queue = max(0.0, s.reported_queue - (now - s.reported_at) * rate)
        # a server never answered counts as near (as the finder counts it fast), so that
        # each gets tried: a newcomer ranked by the typical link lost every call to the
        # near half of the swarm and never served (the churn test's late joiner)
        overhead = s.overhead if s.overhead is not None else 0.0
        return (max(queue, s.outstanding) + units) / rate + overhead

    def order(
        self,
        servers: Sequence[K],
        units: float,
        now: float,
        key: Callable[[K], Hashable] | None = None,
    ) -> list[K]:
        """``servers`` by when each would finish a call of ``units`` (their given order
        among equals: the finder's ranking). ``key`` maps a server to its identity here
        (default: the server itself)."""
        ident: Callable[[K], Hashable] = key if key is not None else (lambda s: s)
        ranked = sorted(
            enumerate(servers),
            key=lambda item: (round(self.finish_time(ident(item[1]), units, now), 3), item[0]),
        )
        return [s for _, s in ranked]

    def parts(self, servers: Sequence[Hashable], rows: int, units_per_row: float) -> int:
        """How many calls to split one expert's ``rows`` into, each to another of its
        ``servers`` (see :func:`split_parts`), from what is known of their speed and
        links (the typical server's, where one is not measured yet)."""
        known = [self._servers[s] for s in servers if s in self._servers]
        rates = [s.rate for s in known if s.rate is not None]
        overheads = [s.overhead for s in known if s.overhead is not None]
        rate = statistics.median(rates) if rates else self._typical_rate()
        overhead = statistics.median(overheads) if overheads else self._typical_overhead()
        return split_parts(rows, len(servers), units_per_row, rate, overhead)

    def plan(
        self,
        requests: Sequence[tuple[Sequence[Hashable], int]],
        units_per_row: float,
        now: float,
        unheard: Sequence[Sequence[Hashable]] | None = None,
        heard_shares: Sequence[float] | None = None,
    ) -> list[list[Piece] | None]:
        """Where one phase's calls go: ``requests`` holds each expert's servers and rows.
        When some expert's work is long enough to split (:meth:`parts`), every expert
        with servers gets pieces, each pinned to one of its servers (an expert not worth
        splitting: one piece); otherwise none does (None: one call, its server chosen
        when it is sent, as :meth:`order` ranks them then).

        A phase waits for its slowest call. Cutting each expert into equal parts and
        sending each part to the server expected to finish it first left the busiest
        of 32 volunteers with 1.44 times the mean work of a phase (stop 65, 32
        volunteers, one batch in flight: ~48 parts of 8 experts over 32 servers, two
        on some, one on others). So the phase's whole work is levelled: the servers
        are filled, from the one free soonest, up to the one finish time at which
        their room holds all of it (water filling). Experts not worth splitting go
        whole to their roomiest server (the largest first); then the others (fewest
        servers, then most rows, first) are laid one after another over the servers,
        roomiest first, each server filled before the next (McNaughton's wrap-around
        rule, for jobs that may be cut between machines): every server ends at the
        level, and a phase makes at most one call per server plus one per expert,
        whatever the sizes of its pieces. (An expert left to the choice when sent took
        the soonest server, which the plan had filled too: stop 65.)

        ``unheard``: per request, its servers that its rounds have not heard enough
        of lately (core/moe/voices.py); the roomiest of them takes the expert whole, or
        its first piece of at least its ``heard_shares`` of its rows. Without it, a fixed
        order of servers left 14% of experts a round short of 3 voices at 4 servers
        (stop 65, simulated: 8 experts, rounds of 4 batches)."""
        planned: list[list[Piece] | None] = [None] * len(requests)
        worth = [self.parts(servers, rows, units_per_row) > 1 for servers, rows in requests]
        if not any(worth):
            return planned
        typical = self._typical_rate()
        assert typical is not None  # parts() splits only when a rate is known
        placed = [i for i, (own, rows) in enumerate(requests) if own and rows > 0]
        servers = list(dict.fromkeys(s for i in placed for s in requests[i][0]))
        rates = {s: self._rate_of(s, typical) for s in servers}
        free_at = {s: self.finish_time(s, 0.0, now) for s in servers}
        work = sum(requests[i][1] for i in placed) * units_per_row
        level = water_level([free_at[s] for s in servers], [rates[s] for s in servers], work)
        room = {s: max(0.0, level - free_at[s]) * rates[s] / units_per_row for s in servers}

        def first(i: int) -> Hashable | None:
            """The roomiest server request ``i``'s rounds need to hear, if any."""
            mine = set(requests[i][0])
            wanted = [s for s in (unheard[i] if unheard else ()) if s in mine]
            return max(wanted, key=lambda s: room[s]) if wanted else None

        for i in sorted((i for i in placed if not worth[i]), key=lambda i: (-requests[i][1], i)):
            own, rows = requests[i]
            server = first(i)
            if server is None:
                server = max(dict.fromkeys(own), key=lambda s: room[s])  # ties: the first
            room[server] -= rows
            planned[i] = [Piece(0, rows, server)]
        line = sorted(servers, key=lambda s: -room[s])  # stable: the finder's ranking
        split = sorted(
            (i for i in placed if worth[i]),
            key=lambda i: (len(set(requests[i][0])), -requests[i][1], i),
        )
        for i in split:
            own, rows = requests[i]
            mine = set(own)
            order = [s for s in line if s in mine]
            need = first(i)
            if need is None:
                planned[i] = lay(rows, order, room)
            else:
                order = [need, *(s for s in order if s != need)]
                share = heard_shares[i] if heard_shares else 0.0
                planned[i] = lay(rows, order, room, math.ceil(share * rows))
        return planned

    def _rate_of(self, server: Hashable, typical: float) -> float:
        known = self._servers.get(server)
        return known.rate if known is not None and known.rate is not None else typical

    def _typical_overhead(self) -> float | None:
        values = [s.overhead for s in self._servers.values() if s.overhead is not None]
        return statistics.median(values) if values else None

    def _typical_rate(self) -> float | None:
        rates = [s.rate for s in self._servers.values() if s.rate is not None]
        return statistics.median(rates) if rates else None


@dataclass(frozen=True)
class Piece:
    """Rows ``start:stop`` of one expert's, for ``server``."""

    start: int
    stop: int
    server: Hashable

    @property
    def rows(self) -> int:
        return self.stop - self.start


def water_level(free_at: Sequence[float], rates: Sequence[float], work: float) -> float:
    """The finish time at which servers free at ``free_at`` (seconds from now), working
    at ``rates`` (units a second), have done ``work`` units between them, each busy
    from its own time to that one: the level of water poured over steps."""
    if not free_at or work <= 0:
        return min(free_at, default=0.0)
    order = sorted(range(len(free_at)), key=lambda i: free_at[i])
    rate_sum = weighted = 0.0
    for k, i in enumerate(order):
        rate_sum += rates[i]
        weighted += free_at[i] * rates[i]
        level = (work + weighted) / rate_sum
        if k + 1 == len(order) or level <= free_at[order[k + 1]]:
            return level
    raise AssertionError("unreachable: the last server always returns")


def lay(
    rows: int, servers: Sequence[Hashable], room: dict[Hashable, float], first_at_least: int = 0
) -> list[Piece]:
    """One expert's ``rows`` laid over its ``servers`` in their order, each filled to its
    ``room`` (rows; what a piece takes is taken from it) before the next, the first
    given at least ``first_at_least`` rows; what no room holds (its servers are too few
    for the level) is shared out evenly over them."""
    taken: dict[Hashable, int] = {}
    rest = rows
    for k, server in enumerate(servers):
        if rest <= 0:
            break
        fill = math.ceil(room[server] - 1e-6)  # up: no row left for the end
        take = min(rest, max(fill, first_at_least) if k == 0 else fill)
        if take > 0:
            taken[server] = take
            room[server] -= take
            rest -= take
    for k, server in enumerate(servers if rest > 0 else ()):  # shared out evenly
        share = rest // len(servers) + (k < rest % len(servers))
        if share:
            taken[server] = taken.get(server, 0) + share
            room[server] -= share
    pieces, start = [], 0
    for server, take in taken.items():
        pieces.append(Piece(start, start + take, server))
        start += take
    return pieces


#: a part of a split call is never smaller than this many rows...
MIN_PART_ROWS = 32
#: ...nor shorter in compute than this many times its link's overhead, or than
#: MIN_PART_SECONDS (a call costs both ends work that no rate measures: framing,
#: receipts, threads)
PART_OVERHEADS = 4.0
MIN_PART_SECONDS = 0.25


def split_parts(
    rows: int, servers: int, units_per_row: float, rate: float | None, overhead: float | None
) -> int:
    """Calls to split one expert's rows into. One call is one server's work: a phase of
    a step (forward or backward through a layer) waits for its slowest call, so a long
    call on one server while the expert's other servers idle caps a swarm of slow
    volunteers (16 volunteers at 0.125 samples/s: 512 rows, 2.7 s forward and 5.3 s
    backward, on one server). Split into at most one part per server, each at least
    MIN_PART_ROWS and computing at least PART_OVERHEADS times the link's overhead and
    MIN_PART_SECONDS; one call while the servers' speed or links are not known.

    A trainer asks it only whether an expert's work is worth splitting (more than one
    part): how the work is cut is the phase's plan (:meth:`ServerLoads.plan`)."""
    if servers < 2 or rate is None or overhead is None or rate <= 0:
        return 1
    seconds = rows * units_per_row / rate
    by_time = int(seconds / max(PART_OVERHEADS * overhead, MIN_PART_SECONDS))
    return max(1, min(servers, rows // MIN_PART_ROWS, by_time))
