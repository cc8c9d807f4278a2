"""RPC method names of aggregators, and which aggregator takes which expert.

agg.contribute  meta {header: Contribution}, tensors [the encoded gradient parts]
                -> meta {accepted, version, audit?} (audit: reveal it), or an error whose
                code is the refusal's reason
agg.reveal      meta {nonce, pairs, residual, carried?} or {nonce, missing: true},
                tensors [inputs and output gradients per receipt, residual, carried parts]
                -> meta {outcome}: the volunteer shows what an audited contribution was
                computed from (core/contributing/reveal.py, core/aggregator/auditor.py)
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

Aggregator = TypeVar("Aggregator")


def responsible_aggregator(uid: str, aggregators: Sequence[Aggregator]) -> Aggregator:
    """Each expert has one aggregator: chosen by hashing its uid, the same for everyone."""
    index = int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "big") % len(aggregators)
    return aggregators[index]
