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
agg.stats       meta {} -> meta {accepted, rejected, rounds, banned_peers, versions,
                contributors, pending_samples}
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final, TypeVar

CONTRIBUTE: Final = "agg.contribute"
STATS: Final = "agg.stats"
REVEAL: Final = "agg.reveal"
REFEREE: Final = "agg.referee"
#: rows one referee request may ask recomputed (an auditor sends a share of an answer's)
MAX_REFEREE_ROWS: Final = 1024

Aggregator = TypeVar("Aggregator")


def responsible_aggregator(uid: str, aggregators: Sequence[Aggregator]) -> Aggregator:
    """Each expert has one aggregator: chosen by hashing its uid, the same for everyone."""
    index = int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "big") % len(aggregators)
    return aggregators[index]
