"""Answer checks (pure): whether an expert answer passes, decided from tensors and
numbers alone, with no network and no trio.

What an answer is (:class:`Answer`) and the volunteer's signed statement behind it
(:class:`Evidence`, :func:`statement_problem`, :func:`check_evidence`, which a third
party holding the published weights runs); the recomputation of an answer's rows with
an expert's weights (:func:`recompute`, :func:`recompute_rows`) and its excess over an
honest answer's bound (:func:`audit`, against core/experts/tolerance.py); which rows of
a drawn answer to recompute (:func:`rows_to_recompute`); the verdict of other servers'
recomputations where the weights cannot be had (:func:`by_quorum`); and a failed
audit's record (:class:`Finding`, with how long it excludes its server). The auditor
that draws answers and acts on these verdicts is core/moe/audit.py.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from core.experts import activations
from core.experts.activations import ActivationCodecError
from core.experts.tolerance import excess, in_float32
from core.protocol.answers import NONE, AnswerStatement, parts_digest
from core.protocol.contributions import tensor_digest
from net import PeerID, Tensor
from net.identity import peer_id_from_public_key


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
    gradients for ``grad_outputs`` (backward; no parameter gradient is kept). In
    float32 from the inputs as ``dtype`` holds them (tolerance.in_float32)."""
    x = inputs.to(dtype).float()
    module = in_float32(module)
    if kind == "forward":
        with torch.no_grad():
            out: torch.Tensor = module(x)
        return out
    if grad_outputs is None:
        raise ValueError("a backward recomputation needs the output gradients")
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        y = module(x)
        (grad,) = torch.autograd.grad(y, x, grad_outputs.to(dtype).float())
    return grad


def audit(module: nn.Module, answer: Answer, dtype: torch.dtype) -> float:
    """How far past an honest answer's bound ``answer`` is (<= 1: it passes)."""
    expected = recompute(module, answer, dtype)
    return excess(answer.claimed, expected, answer.codec, dtype)


def rows_to_recompute(n: int, share: float, rng: random.Random) -> list[int]:
    """Which of a drawn answer's ``n`` rows to recompute: a ``share`` of them (at least
    one), drawn with ``rng`` (all of them when the share covers every row)."""
    k = max(1, math.ceil(n * share))
    return list(range(n)) if k >= n else sorted(rng.sample(range(n), k))
