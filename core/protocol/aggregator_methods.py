"""RPC method names of aggregators, and which aggregator takes which expert.

agg.contribute  meta {header: Contribution}, tensors [the encoded gradient parts]
                -> meta {accepted, version, audit?} (audit: reveal it), or an error whose
                code is the refusal's reason
agg.reveal      meta {nonce, pairs, residual, carried?} or {nonce, missing: true},
                tensors [inputs and output gradients per receipt, residual, carried parts]
                -> meta {outcome}: the volunteer shows what an audited contribution was
                computed from (core/contributing/reveal.py, core/aggregator/auditor.py)
agg.referee     meta {uid, version, kind}, tensors [inputs, grad_outputs (backward)], raw
                -> tensors [what the weights of that version compute: outputs, or input
                gradients]: settles a dispute over an answer (core/moe/audit.py); only
                the manifest's trainers may ask, at most MAX_REFEREE_ROWS rows
agg.stats       meta {} -> meta {signed: SignedReport} (core/protocol/signed_report.py):
                an AggregatorReport {accepted, rejected, rounds, banned_peers, versions,
                contributors, audits, pending_samples, short_of_contributors}, signed
agg.credit, agg.evaluation(s): core/protocol/credit.py, core/protocol/evaluations.py
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Final, TypeVar

from pydantic import BaseModel, ConfigDict

CONTRIBUTE: Final = "agg.contribute"
STATS: Final = "agg.stats"
REVEAL: Final = "agg.reveal"
REFEREE: Final = "agg.referee"
#: rows one referee request may ask recomputed (an auditor sends a share of an answer's)
MAX_REFEREE_ROWS: Final = 1024
#: contributors an account lists: those with the most credit, then the most active
MAX_CONTRIBUTORS_LISTED: Final = 256

Aggregator = TypeVar("Aggregator")


class _Report(BaseModel):
    """What an aggregator reports: frozen; keys it does not know are ignored (a newer
    aggregator may add figures), values of the wrong type are an error."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class ContributorReport(_Report):
    accepted: int = 0
    #: refusals, by reason code (core/protocol/refusals.py)
    rejected: dict[str, int] = {}
    rounds: int = 0
    #: the mean share of its input the robust rule kept, over the rounds it shared with
    #: other contributors (1: untouched; None: it never shared one)
    influence: float | None = None
    #: the samples of its contributions that rounds applied (credit: these times the
    #: share kept)
    samples: int = 0
    #: its credit in this aggregator's books (core/aggregator/credit.py), and what bans
    #: took back; a signed statement of it: agg.credit (core/protocol/credit.py)
    credit: float = 0.0
    credit_revoked: float = 0.0


class ContributionAuditReport(_Report):
    drawn: int = 0
    passed: int = 0
    failed: int = 0
    #: discarded without blame: no reveal in time, or it could not be recomputed
    unrevealed: int = 0
    unverifiable: int = 0
    #: why audits failed or could not be done, counted by kind
    problems: dict[str, int] = {}


class AggregatorReport(_Report):
    """agg.stats: an aggregator's own account."""

    accepted: int = 0
    #: refusals, by reason code
    rejected: dict[str, int] = {}
    rounds: int = 0
    banned_peers: int = 0
    versions: dict[str, int] = {}
    #: the most active contributors (hex public key), at most MAX_CONTRIBUTORS_LISTED
    contributors: dict[str, ContributorReport] = {}
    #: the contribution audits (None: the project audits none)
    audits: ContributionAuditReport | None = None
    pending_samples: dict[str, int] = {}
    #: rounds due but for more distinct contributors, and how many more each needs
    short_of_contributors: dict[str, int] = {}
    #: the samples of the experts' contributions applied, by how many versions old their
    #: weights were (index 0: the version the round replaced), and the mean; with the
    #: mean seconds from acceptance to the round and from signing to the round (the
    #: contributor's clock), over the same samples. Empty and None before a round
    #: applied any
    lateness: list[int] = []
    mean_versions_late: float | None = None
    mean_round_wait_s: float | None = None
    mean_age_s: float | None = None


def responsible_aggregator(
    uid: str, aggregators: Sequence[Aggregator], assignment: Mapping[str, int] | None = None
) -> Aggregator:
    """Each expert has one aggregator: the manifest's ``assignment``
    (core/project/assignment.py, balanced by parameters) when it names ``uid``; else
    chosen by hashing the uid. The same for everyone."""
    index = (assignment or {}).get(uid)
    if index is None or not 0 <= index < len(aggregators):
        index = int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "big") % len(aggregators)
    return aggregators[index]
