"""Answer audits: a trainer recomputes a random share of the expert answers it gets.

A volunteer can return any finite tensor as an expert's outputs or input gradients; only
recomputing tells whether the weights it names computed it. After an answer arrives (so
the volunteer cannot know which answers are audited), the trainer draws whether to audit
it; a drawn answer joins a short queue, and a task recomputes it from the weights of the
version the answer names (fetched from the project's aggregators, or the owner's
initial files, checked against their published hashes, kept within a memory budget) on
the inputs the server decoded. The difference is checked against the bound of an honest
answer (core/experts/tolerance.py); past it, the volunteer is excluded from this
trainer's calls at once.

Where those weights cannot be had (a version never published, or more than the memory
budget holds), a forward answer goes to other servers of its expert, drawn at random:
one that reproduces it passes it; two that agree with each other and not with it fail
it; otherwise it is inconclusive (BOINC's quorum, on a share of the rows; two servers
that collude can pass each other's cheats, which the weights would not). Servers are
free identities, so a quorum alone never convicts for good: a dispute (two agreeing
servers against the answer) goes to the expert's aggregator, the *referee*, which holds
the weights of its recent versions and recomputes the rows. Its verdict is the
weights': an answer it clears passes (and the servers that disputed it are excluded
here), one it confirms fails as an answer checked against the weights does. Without a
referee's word the quorum's verdict excludes the server here only, for a while.

The audits run beside training, one at a time, in a worker thread: a queue full of
pending audits drops new draws (counted) rather than slow a step.

The pure checks (what an answer is, its recomputation and excess, the rows drawn, the
quorum's verdict, a finding) are in core/moe/answer_checks.py; the published weights
fetched and kept for the recomputations (``PublishedWeights``) in core/moe/published.py.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import trio
from torch import nn

from core.experts.tolerance import excess
from core.moe.answer_checks import (
    QUORUM_EXCLUSION_S,
    Answer,
    Finding,
    audit,
    by_quorum,
    rows_to_recompute,
)
from net import PeerID

log = logging.getLogger(__name__)


@dataclass
class AnswerAuditStatistics:
    drawn: int = 0
    audited: int = 0
    passed: int = 0
    failed: int = 0
    #: the weights of the version an answer named could not be had (an old version no
    #: longer announced, or one never published), nor other servers' opinions settle it
    unverifiable: int = 0
    #: of the audited: settled by other servers' recomputations instead of the weights
    by_quorum: int = 0
    #: of those: disputes the referee (the expert's aggregator) settled with the weights
    refereed: int = 0
    #: drawn while the queue was full, or from a volunteer excluded meanwhile
    dropped: int = 0
    #: recomputing, in the worker thread
    seconds: float = 0.0
    #: the largest excess of an answer that passed (honest answers: at most 1)
    worst_passed: float = 0.0
    excluded: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "drawn": self.drawn,
            "audited": self.audited,
            "passed": self.passed,
            "failed": self.failed,
            "unverifiable": self.unverifiable,
            "by_quorum": self.by_quorum,
            "refereed": self.refereed,
            "dropped": self.dropped,
            "seconds": round(self.seconds, 3),
            "worst_passed": round(self.worst_passed, 4),
            "excluded": list(self.excluded),
        }


class VersionWeights(Protocol):
    """Where an auditor gets the weights of an expert's version."""

    async def module(self, uid: str, version: int) -> nn.Module | None:
        """The expert at ``version``, or None when those weights cannot be had."""
        ...


#: asks one more server of ``answer``'s expert, none of ``asked``, for the forward pass of
#: its rows at its version, uncompressed: (that server, its outputs), or None when no
#: other server gives one
SecondOpinion = Callable[[Answer, set[PeerID]], Awaitable[tuple[PeerID, torch.Tensor] | None]]
#: what the weights of ``answer``'s version compute for its rows (outputs, or input
#: gradients), from a party that holds them (the expert's aggregator); None: no word
Referee = Callable[[Answer], Awaitable[torch.Tensor | None]]


class AnswerAuditor:
    """Draws answers to audit at ``rate``, recomputes them, excludes who fails."""

    def __init__(
        self,
        weights: VersionWeights,
        dtype: torch.dtype,
        *,
        rate: float,
        row_share: float = 1.0,
        on_mismatch: Callable[[Finding], None] | None = None,
        queue: int = 32,
        rng: random.Random | None = None,
        second_opinion: SecondOpinion | None = None,
        referee: Referee | None = None,
    ) -> None:
        """``row_share``: the share of a drawn answer's rows recomputed (at least one):
        an expert computes each row (sample) on its own, so a cheat on every row shows
        in any of them, for a fraction of the cost. ``second_opinion``: where the
        weights of an answer's version cannot be had (not published, or more than the
        memory budget holds), the answer is put to other servers of its expert instead
        (:func:`by_quorum`). ``referee``: settles a dispute, where two servers agree
        against an answer, with the weights (the module's docstring)."""
        if not 0 <= rate <= 1:
            raise ValueError(f"audit rate must be in [0, 1], got {rate}")
        if not 0 < row_share <= 1:
            raise ValueError(f"audited share of rows must be in (0, 1], got {row_share}")
        self.row_share = row_share
        self.weights = weights
        self.dtype = dtype
        self.rate = rate
        self.second_opinion = second_opinion
        self.referee = referee
        #: told of every volunteer that fails an audit, once (e.g. to stop routing to it)
        self.listeners: list[Callable[[Finding], None]] = []
        if on_mismatch is not None:
            self.listeners.append(on_mismatch)
        #: told of every server excluded here, and for how long (seconds; inf: for
        #: good): those that failed an audit, and those whose opinions the referee
        #: contradicted (e.g. to stop routing to them)
        self.exclusion_listeners: list[Callable[[PeerID, float], None]] = []
        # the volunteer must not predict the draws: the system's randomness by default
        self._rng = rng if rng is not None else random.SystemRandom()
        self._send, self._receive = trio.open_memory_channel[Answer](queue)
        self.stats = AnswerAuditStatistics()
        self.findings: list[Finding] = []
        #: who failed an audit, until when (trio's clock; inf: for good)
        self._excluded: dict[PeerID, float] = {}

    def draw(self) -> bool:
        """Whether to audit the answer that just arrived."""
        return self.rate > 0 and self._rng.random() < self.rate

    def rows(self, n: int) -> list[int]:
        """Which of a drawn answer's ``n`` rows to recompute (drawn like the answer)."""
        return rows_to_recompute(n, self.row_share, self._rng)

    def submit(self, answer: Answer) -> None:
        """Queue a drawn answer (dropped, counted, when the queue is full)."""
        self.stats.drawn += 1
        if self.is_excluded(answer.server):
            self.stats.dropped += 1
            return
        try:
            self._send.send_nowait(answer)
        except trio.WouldBlock:
            self.stats.dropped += 1

    def close(self) -> None:
        """No more answers: ``run`` returns once the queued ones are audited."""
        self._send.close()

    def is_excluded(self, peer_id: PeerID) -> bool:
        until = self._excluded.get(peer_id)
        return until is not None and until > trio.current_time()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for answer in self._receive:
            if self.is_excluded(answer.server):
                self.stats.dropped += 1
                continue
            await self.check(answer)

    async def check(self, answer: Answer) -> float | None:
        """Audit one answer now: its excess, or None when its weights cannot be had. An
        answer without a statement that matches it fails at once (infinite excess)."""
        if answer.evidence is None:
            self.stats.audited += 1
            self._failed(answer, math.inf)
            return math.inf
        module = await self.weights.module(answer.uid, answer.version)
        quorum = module is None
        if module is None:
            settled = await self._by_quorum(answer)
            if settled is None:
                self.stats.unverifiable += 1
                return None
            over, disputed_by = settled
            self.stats.by_quorum += 1
            if over > 1 and (refereed := await self._refereed(answer, disputed_by)) is not None:
                over, quorum = refereed, False
        else:
            started = time.perf_counter()
            over = await trio.to_thread.run_sync(audit, module, answer, self.dtype)
            self.stats.seconds += time.perf_counter() - started
        self.stats.audited += 1
        if over <= 1:
            self.stats.passed += 1
            self.stats.worst_passed = max(self.stats.worst_passed, over)
            return over
        self._failed(answer, over, by_quorum=quorum)
        return over

    async def _by_quorum(self, answer: Answer) -> tuple[float, list[PeerID]] | None:
        """The answer's excess as other servers of its expert judge it, with the
        servers whose outputs it was judged by; or None."""
        if self.second_opinion is None:
            return None
        asked = {answer.server}
        first = await self.second_opinion(answer, asked)
        if first is None:
            return None
        asked.add(first[0])
        over_first = excess(answer.claimed, first[1], answer.codec, self.dtype)
        if over_first <= 1:
            return over_first, [first[0]]
        second = await self.second_opinion(answer, asked)
        if second is None:
            return None
        over_second = excess(answer.claimed, second[1], answer.codec, self.dtype)
        agree = excess(first[1], second[1], "raw", self.dtype) <= 1
        verdict = by_quorum(over_first, over_second, agree)
        return None if verdict is None else (verdict, [first[0], second[0]])

    async def _refereed(self, answer: Answer, disputed_by: list[PeerID]) -> float | None:
        """The answer's excess over what the referee's weights compute, or None when
        the referee gives no word. When it clears the answer, the servers that
        disputed it answered what those weights do not compute: excluded here, for
        good (their opinions carry no statement to publish, so no ban)."""
        if self.referee is None:
            return None
        expected = await self.referee(answer)
        if expected is None:
            return None
        self.stats.refereed += 1
        over = excess(answer.claimed, expected, answer.codec, self.dtype)
        if over <= 1:
            for server in disputed_by:
                log.warning(
                    "%s disputed an answer of %s to %s that the expert's aggregator "
                    "reproduced from the weights: excluded",
                    server,
                    answer.server,
                    answer.uid,
                )
                self._exclude(server, math.inf)
        return over

    def _exclude(self, server: PeerID, seconds: float) -> None:
        if self.is_excluded(server):
            return
        self._excluded[server] = trio.current_time() + seconds
        self.stats.excluded.append(str(server))
        for listener in self.exclusion_listeners:
            listener(server, seconds)

    def _failed(self, answer: Answer, over: float, *, by_quorum: bool = False) -> None:
        self.stats.failed += 1
        finding = Finding(answer, over, by_quorum)
        self.findings.append(finding)
        del self.findings[:-16]  # the latest, as evidence
        if not self.is_excluded(answer.server):
            self._exclude(answer.server, finding.exclusion_seconds)
            log.warning(
                "%s answered %s of %s (version %d) %.3g times past an honest answer's "
                "bound%s: excluded%s",
                answer.server,
                answer.kind,
                answer.uid,
                answer.version,
                over,
                " by two other servers' recomputations" if by_quorum else "",
                f" for {QUORUM_EXCLUSION_S / 60:.0f} min, here only" if by_quorum else "",
            )
            for listener in self.listeners:
                listener(finding)
