"""The aggregator's contribution audits on the network (decision 010): draw accepted
contributions at random, hold them out of rounds, take the volunteer's reveal, recompute
(core/aggregator/audit.py) and act: a contribution that passes joins its round; one that
fails is discarded and its volunteer accused (project ban, with the evidence kept); one
that cannot be audited (never revealed, its weights gone, its residual's source unknown)
is discarded without blame, so refusing to reveal gains a cheater nothing.

The draw happens after the contribution is signed and sent: the volunteer cannot know
which of its contributions will be checked."""

from __future__ import annotations

import logging
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import torch
import trio

from core.aggregator.audit import ContributionEvidence, Verdict, audit
from core.aggregator.core import AggregatorCore
from core.contributing.reveal import Reveal, RevealError
from core.experts.registry import build_expert
from core.experts.wire import from_wire
from core.protocol.aggregator_methods import ContributionAuditReport
from core.protocol.contributions import TRUNK_UID, Contribution
from net import BadRequest, CallContext, RemoteError, Reply
from net.identity import peer_id_from_public_key

log = logging.getLogger(__name__)

#: failed audits whose evidence is kept (the newest)
MAX_FINDINGS: Final = 16
#: contributions held for an audit at once; past it, no more are drawn
MAX_HELD: Final = 256
#: how long an audit waits for the contribution whose residual it carries to arrive (a
#: volunteer delivers its contributions concurrently: the later one may come first)
CARRIED_WAIT_SECONDS: Final = 30.0


class NotAudited(RemoteError):
    code = "not_audited"


@dataclass(frozen=True)
class ContributionFinding:
    """A contribution that failed its audit."""

    contributor: str  # peer id
    uid: str
    version: int
    verdict: Verdict
    evidence: ContributionEvidence


@dataclass
class _Held:
    contribution: Contribution
    parts: list[torch.Tensor]
    deadline: float  # trio time by which its reveal must come


@dataclass
class ContributionAuditStatistics:
    drawn: int = 0
    passed: int = 0
    failed: int = 0
    #: discarded without blame: no reveal in time, or it could not be recomputed
    unrevealed: int = 0
    unverifiable: int = 0
    problems: Counter[str] = field(default_factory=Counter)

    def report(self) -> ContributionAuditReport:
        return ContributionAuditReport(
            drawn=self.drawn,
            passed=self.passed,
            failed=self.failed,
            unrevealed=self.unrevealed,
            unverifiable=self.unverifiable,
            problems=dict(self.problems),
        )


class ContributionAuditor:
    def __init__(
        self,
        core: AggregatorCore,
        engine: trio.CapacityLimiter,
        *,
        rate: float,
        reveal_seconds: float = 120.0,
        rng: random.Random | None = None,
    ) -> None:
        self.core = core
        self.engine = engine  # the core is used by one thread at a time
        self.rate = rate
        self.reveal_seconds = reveal_seconds
        self.rng = rng or random.SystemRandom()
        self.stats = ContributionAuditStatistics()
        self.findings: deque[ContributionFinding] = deque(maxlen=MAX_FINDINGS)
        #: told of every failed audit (the role publishes a ban)
        self.listeners: list[Callable[[ContributionFinding], None]] = []
        self._held: dict[bytes, _Held] = {}
        #: nonces of contributions an audit waits for (carried by the audited one)
        self._awaited: dict[bytes, trio.Event] = {}
        self._nursery: trio.Nursery | None = None
        # recomputations run one at a time, beside the engine: an audit costs the
        # volunteer's own work for the contribution
        self._compute = trio.CapacityLimiter(1)

    def draw(self, contribution: Contribution) -> bool:
        """Whether to audit this contribution (decided once, after it was sent)."""
        if self.rate <= 0 or contribution.uid == TRUNK_UID or len(self._held) >= MAX_HELD:
            return False
        return self.rng.random() < self.rate

    def accepted(self, nonce: bytes) -> None:
        """A contribution was accepted (an audit may be waiting for it)."""
        event = self._awaited.get(nonce)
        if event is not None:
            event.set()

    def hold(self, contribution: Contribution, parts: list[torch.Tensor]) -> None:
        """Wait for the reveal of a contribution drawn (and accepted held)."""
        self.stats.drawn += 1
        deadline = trio.current_time() + self.reveal_seconds
        self._held[contribution.nonce] = _Held(contribution, parts, deadline)

    async def run(
        self, *, task_status: trio.TaskStatus[ContributionAuditor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Audit what is revealed, and discard what is not revealed in time."""
        for entry in self.core.held():  # held when the aggregator last stopped
            if entry.contribution is not None and entry.parts is not None:
                self.stats.drawn -= 1  # counted when first drawn
                self.hold(entry.contribution, entry.parts)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(self)
            while True:
                now = trio.current_time()
                for nonce in [n for n, h in self._held.items() if h.deadline < now]:
                    self.stats.unrevealed += 1
                    await self._settle(nonce, discard=True)
                await trio.sleep(1.0)

    async def reveal(self, ctx: CallContext) -> Reply:
        """The volunteer's reveal of a contribution we hold (RPC handler)."""
        nonce = ctx.request.meta.get("nonce")
        held = self._held.get(nonce) if isinstance(nonce, bytes) else None
        if held is None:
            raise NotAudited("no audit of that contribution is waiting")
        contribution = held.contribution
        if ctx.peer_id != peer_id_from_public_key(contribution.contributor):
            raise BadRequest("only the contribution's volunteer may reveal it")
        if ctx.request.meta.get("missing") is True:
            del self._held[contribution.nonce]
            self.stats.unrevealed += 1
            await self._settle(contribution.nonce, discard=True)
            return Reply({"outcome": "discarded"})
        try:
            reveal = Reveal.from_wire(
                ctx.request.meta,
                [from_wire(t) for t in ctx.request.tensors],
                contribution,
                self.core.settings.spec,
            )
        except (RevealError, ValueError) as exc:
            raise BadRequest(f"not a reveal of that contribution: {exc}") from exc
        del self._held[contribution.nonce]
        assert self._nursery is not None
        self._nursery.start_soon(self._audit, held, reveal)
        return Reply({"outcome": "received"})

    async def _audit(self, held: _Held, reveal: Reveal) -> None:
        c = held.contribution
        weights = await trio.to_thread.run_sync(
            self.core.weights_of, c.uid, c.base_version, limiter=self.engine
        )
        if weights is None:
            gone = f"the weights of version {c.base_version} are gone"
            verdict = Verdict("unverifiable", 0.0, gone)
        else:
            if c.carried and c.carried not in self.core.seen.nonces:
                arrived = self._awaited.setdefault(c.carried, trio.Event())
                with trio.move_on_after(CARRIED_WAIT_SECONDS):
                    await arrived.wait()
                self._awaited.pop(c.carried, None)
            carried_accepted = bool(c.carried) and c.carried in self.core.seen.nonces
            verdict = await trio.to_thread.run_sync(
                self._recompute, held, reveal, weights, carried_accepted, limiter=self._compute
            )
        who = str(peer_id_from_public_key(c.contributor))
        if verdict.outcome == "passed":
            self.stats.passed += 1
            await self._settle(c.nonce, discard=False)
            return
        # by kind: without figures or names, so a cheater cannot grow the stats reply
        self.stats.problems[_kind(verdict.problem)] += 1
        await self._settle(c.nonce, discard=True)
        if verdict.outcome == "unverifiable":
            self.stats.unverifiable += 1
            log.info("could not audit a contribution of %s to %s: %s", who, c.uid, verdict.problem)
            return
        self.stats.failed += 1
        log.warning("a contribution of %s to %s failed its audit: %s", who, c.uid, verdict.problem)
        finding = ContributionFinding(
            who,
            c.uid,
            c.base_version,
            verdict,
            ContributionEvidence(c.encode(), tuple(held.parts), reveal, verdict.excess),
        )
        self.findings.append(finding)
        for listener in self.listeners:
            listener(finding)

    def _recompute(
        self,
        held: _Held,
        reveal: Reveal,
        weights: dict[str, torch.Tensor],
        carried_accepted: bool,
    ) -> Verdict:
        spec = self.core.settings.spec
        module = build_expert(spec)
        module.load_state_dict(weights)
        return audit(
            spec, module, held.contribution, held.parts, reveal, carried_accepted=carried_accepted
        )

    async def _settle(self, nonce: bytes, *, discard: bool) -> None:
        self._held.pop(nonce, None)
        settle = self.core.discard if discard else self.core.release
        await trio.to_thread.run_sync(settle, nonce, limiter=self.engine)


def _kind(problem: str) -> str:
    """A verdict's problem without its particulars (indices, parameter names, figures)."""
    words = problem.split(" (")[0].split()
    return " ".join(w for w in words if not any(ch.isdigit() or ch in "._" for ch in w))[:80]
