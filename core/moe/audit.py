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
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
import trio
from torch import nn

from core.experts import activations
from core.experts.activations import ActivationCodecError
from core.experts.registry import ExpertSpec, build_expert
from core.experts.tolerance import excess
from core.experts.weights import WeightsError, load_weights_bytes, weights_hash
from core.project.chunks import ChunkStore
from core.project.distribution import FetchError, WeightsFetcher
from core.project.signed import SignedManifest
from core.project.versions import VersionRecord, fetch_version, newest_version
from core.protocol.answers import NONE, AnswerStatement, parts_digest
from core.protocol.contributions import tensor_digest
from net import Peer, PeerID, Tensor
from net.identity import peer_id_from_public_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    """One expert answer as the trainer got it, with what the server computed it from."""

    kind: Literal["forward", "backward"]
    uid: str
    server: PeerID
    version: int  # the weights the answer names
    inputs: torch.Tensor  # as the server decoded them
    grad_outputs: torch.Tensor | None  # backward: as the server decoded them
    claimed: torch.Tensor  # the answer, as decoded here
    codec: str  # the codec the answer travelled in
    #: what the volunteer signed, and the whole request and answer it covers; None: the
    #: answer came without a statement that matches it (an honest server always signs)
    evidence: Evidence | None = None


@dataclass(frozen=True)
class Evidence:
    """A volunteer's signed statement with what it covers: enough for anyone holding the
    published weights of its version to recompute the answer (:func:`check_evidence`)."""

    statement: AnswerStatement
    inputs: torch.Tensor  # all rows, as the server decoded them
    grad_outputs: torch.Tensor | None  # backward: all rows, as the server decoded them
    parts: tuple[Tensor, ...]  # the answer as it travelled


class EvidenceError(ValueError):
    """Evidence that does not hold together: a bad signature, or tensors that are not
    the ones the statement names."""


def statement_problem(evidence: Evidence) -> str | None:
    """Why ``evidence`` does not hold together, or None when the signature is good and
    every tensor is the one the statement names."""
    s = evidence.statement
    grads = evidence.grad_outputs
    problems = [
        (not s.verify(), "signature"),
        (s.inputs_sha256 != tensor_digest([evidence.inputs]), "inputs"),
        (s.grads_sha256 != (NONE if grads is None else tensor_digest([grads])), "gradients"),
        (s.answer_sha256 != parts_digest(evidence.parts), "answer"),
        ((s.kind == "backward") != (grads is not None), "kind"),
    ]
    wrong = [what for bad, what in problems if bad]
    return ", ".join(wrong) if wrong else None


def check_evidence(evidence: Evidence, module: nn.Module, dtype: torch.dtype) -> float:
    """What a third party does with evidence: check that it holds together, then
    recompute the whole answer with ``module`` (the published weights of the version the
    statement names) and return its excess (> 1: the volunteer signed a wrong answer).
    Raises EvidenceError when the evidence does not hold together."""
    problem = statement_problem(evidence)
    if problem is not None:
        raise EvidenceError(f"the evidence does not match its statement: {problem}")
    s = evidence.statement
    try:
        claimed = activations.decode(
            evidence.parts, s.codec, width=evidence.inputs.shape[-1], dtype=evidence.inputs.dtype
        )
    except ActivationCodecError:
        return math.inf  # signed parts that do not even decode
    answer = Answer(
        s.kind,
        s.uid,
        peer_id_from_public_key(s.volunteer),
        s.version,
        evidence.inputs,
        evidence.grad_outputs,
        claimed,
        s.codec,
    )
    return audit(module, answer, dtype)


#: How long a server whose answer other servers convicted is left out of a trainer's
#: calls. Servers are free identities: two that agree can convict anyone, so a quorum's
#: verdict is never a ban, and it lapses.
QUORUM_EXCLUSION_S = 1800.0


@dataclass(frozen=True)
class Finding:
    """A failed audit: ``excess`` > 1 is how far past an honest answer's bound it was.
    ``by_quorum``: settled by other servers' recomputations, not by the published
    weights: evidence for this trainer alone (a local exclusion that lapses), never
    for a ban, which must be checkable by anyone from published weights."""

    answer: Answer
    excess: float
    by_quorum: bool = False

    @property
    def exclusion_seconds(self) -> float:
        return QUORUM_EXCLUSION_S if self.by_quorum else math.inf


@dataclass
class AuditStatistics:
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


def by_quorum(first: float, second: float | None, opinions_agree: bool) -> float | None:
    """The verdict on an answer from other servers' recomputations of it, for an auditor
    without the published weights: ``first``, ``second``: the answer's excess over each
    server's outputs (None: no second server answered); ``opinions_agree``: those two
    outputs are within an honest computation's bound of each other. An answer that an
    other server reproduces passes (the second is asked only when the first does not);
    one that two agreeing servers both put past the bound fails (with the smaller
    excess); anything else is inconclusive (None): when the answer and one server
    disagree, nothing says which one lies."""
    if first <= 1:
        return first
    if second is None:
        return None
    if second <= 1:
        return second
    return min(first, second) if opinions_agree else None


def recompute(module: nn.Module, answer: Answer, dtype: torch.dtype) -> torch.Tensor:
    """What ``module`` answers for ``answer``'s inputs (and gradients): outputs, or
    input gradients."""
    return recompute_rows(module, answer.kind, answer.inputs, answer.grad_outputs, dtype)


def recompute_rows(
    module: nn.Module,
    kind: Literal["forward", "backward"],
    inputs: torch.Tensor,
    grad_outputs: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """What ``module`` computes for ``inputs``: outputs (forward), or the input
    gradients for ``grad_outputs`` (backward; no parameter gradient is kept)."""
    x = inputs.to(dtype)
    if kind == "forward":
        with torch.no_grad():
            out: torch.Tensor = module(x)
        return out
    if grad_outputs is None:
        raise ValueError("a backward recomputation needs the output gradients")
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        y = module(x)
        (grad,) = torch.autograd.grad(y, x, grad_outputs.to(dtype))
    return grad


def audit(module: nn.Module, answer: Answer, dtype: torch.dtype) -> float:
    """How far past an honest answer's bound ``answer`` is (<= 1: it passes)."""
    expected = recompute(module, answer, dtype)
    return excess(answer.claimed, expected, answer.codec, dtype)


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
        self.stats = AuditStatistics()
        self.findings: list[Finding] = []
        #: who failed an audit, until when (trio's clock; inf: for good)
        self._excluded: dict[PeerID, float] = {}

    def draw(self) -> bool:
        """Whether to audit the answer that just arrived."""
        return self.rate > 0 and self._rng.random() < self.rate

    def rows(self, n: int) -> list[int]:
        """Which of a drawn answer's ``n`` rows to recompute (drawn like the answer)."""
        k = max(1, math.ceil(n * self.row_share))
        return list(range(n)) if k >= n else sorted(self._rng.sample(range(n), k))

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


class PublishedWeights:
    """The weights of experts' versions as the project published them: the owner's
    initial files (checked against the signed manifest's index) and the versions the
    project's aggregators announce (checked against their signed records), the most
    recently used kept up to ``max_bytes``.

    Answers name the version their volunteer serves, often one that is no longer the
    newest: ``watch`` reads the announced records of the watched experts every
    ``interval`` and remembers the last ``history`` of each, so that an older version's
    file can still be fetched (aggregators keep the chunks) when one of its answers is
    drawn. Only audited versions are downloaded. The watched experts are the
    ``max_watched`` most recently audited (at first, the manifest's first ones): one DHT
    lookup each per ``interval``."""

    def __init__(
        self,
        peer: Peer,
        signed: SignedManifest,
        store: ChunkStore,
        *,
        max_bytes: int = 256 * 2**20,
        aggregator_keys: Collection[bytes] | None = None,
        interval: float = 10.0,
        history: int = 8,
        max_watched: int = 256,
    ) -> None:
        self.peer = peer
        self.signed = signed
        self.spec: ExpertSpec = signed.manifest.model.expert.spec()
        keys = aggregator_keys
        if keys is None:
            keys = [bytes.fromhex(a.key) for a in signed.manifest.aggregators]
        self.allowed = {str(peer_id_from_public_key(k)) for k in keys}
        self.fetcher = WeightsFetcher(peer, store)
        self.max_bytes = max_bytes
        self.interval = interval
        self.history = history
        self.max_watched = max_watched
        self._cache: OrderedDict[tuple[str, int], tuple[nn.Module, int]] = OrderedDict()
        self._missing: set[tuple[str, int]] = set()
        #: per expert, the announced records seen, by version (the newest ``history``)
        self._records: dict[str, dict[int, VersionRecord]] = {}
        #: the experts whose records are read, most recently asked about last
        self._watched: OrderedDict[str, None] = OrderedDict()
        for uid in itertools.islice(signed.manifest.model.expert_uids(), max_watched):
            self._watch(uid)
        self._lock = trio.Lock()
        # an expert's size, without its memory (parameters on the meta device): one larger
        # than the budget is never fetched (its answers go to other servers instead)
        with torch.device("meta"):
            shapes = build_expert(self.spec).state_dict().values()
        self.expert_bytes = _nbytes(shapes)
        if self.expert_bytes > max_bytes:
            log.warning(
                "an expert's weights (%.1f MiB) exceed the audits' budget (%.1f MiB): "
                "answers are audited by other servers' recomputations",
                self.expert_bytes / 2**20,
                max_bytes / 2**20,
            )

    @property
    def cached_bytes(self) -> int:
        return sum(size for _, size in self._cache.values())

    def announced(self, uid: str) -> list[int]:
        """The versions of ``uid`` whose records were seen (and are remembered)."""
        return sorted(self._records.get(uid, {}))

    def _watch(self, uid: str) -> None:
        self._watched[uid] = None
        self._watched.move_to_end(uid)
        while len(self._watched) > self.max_watched:
            self._records.pop(self._watched.popitem(last=False)[0], None)

    async def watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            for uid in list(self._watched):
                await self._look(uid)
            await trio.sleep(self.interval)

    async def _look(self, uid: str) -> VersionRecord | None:
        """The newest announced record of ``uid``, remembered with the last few."""
        record = await newest_version(self.peer, self.signed.project_id, uid, self.allowed)
        if record is not None:
            seen = self._records.setdefault(uid, {})
            seen[record.version] = record
            for old in sorted(seen)[: -self.history]:
                del seen[old]
        return record

    async def module(self, uid: str, version: int) -> nn.Module | None:
        if self.expert_bytes > self.max_bytes:
            return None
        key = (uid, version)
        self._watch(uid)
        async with self._lock:  # one fetch of a version, however many audits want it
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit[0]
            if key in self._missing:
                return None
            try:
                module, final = await self._fetch(uid, version)
            except (FetchError, WeightsError) as exc:
                log.info("weights of %s version %d for an audit: %s", uid, version, exc)
                module, final = None, False
            if module is None:
                if final:  # an old version is not announced again: no lookup per answer
                    self._missing.add(key)
                return None
            size = _nbytes(module.state_dict().values())
            self._cache[key] = (module, size)
            while self.cached_bytes > self.max_bytes and len(self._cache) > 1:
                self._cache.popitem(last=False)
            return module

    async def _fetch(self, uid: str, version: int) -> tuple[nn.Module | None, bool]:
        """The weights of ``version``, or None and whether they will never be had here
        (a version older than every record seen, other than the initial one)."""
        seen = self._records.get(uid, {})
        record = seen.get(version)
        if record is None and (not seen or version > max(seen)):
            newest = await self._look(uid)
            record = newest if newest is not None and newest.version == version else None
        if record is not None:
            blob = await fetch_version(self.fetcher, record)
            module, _ = await trio.to_thread.run_sync(self._load, blob)
            if weights_hash(module) != record.sha256:
                raise FetchError(f"version {version} of {uid} has other weights than announced")
            return module, True
        files = await self.fetcher.fetch(self.signed, [uid])
        module, initial = await trio.to_thread.run_sync(self._load, files[uid])
        if initial == version:
            return module, True
        seen = self._records.get(uid, {})
        return None, bool(seen) and version < max(seen)

    def _load(self, blob: bytes) -> tuple[nn.Module, int]:
        """The expert with these weights, and the version the file names."""
        module = build_expert(self.spec)
        info = load_weights_bytes(module, blob)
        module.requires_grad_(False)
        return module, info.version


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
