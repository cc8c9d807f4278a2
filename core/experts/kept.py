"""What a volunteer keeps so that it can answer a contribution audit (decision 010): the
inputs and output gradients of the backward requests behind each contribution, until
the aggregator says whether it audits it. Bounded by a byte budget shared by every
expert of the node; a contribution whose tensors did not fit cannot be revealed, and an
aggregator that draws it discards it (no offence: the volunteer loses that work)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


class KeptBudget:
    """Bytes of kept tensors the node may hold (thread-safe: compute threads keep,
    the sender's task frees)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.refused = 0  # tensors that did not fit
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        with self._lock:
            if self.used + nbytes > self.max_bytes:
                self.refused += 1
                return False
            self.used += nbytes
            return True

    def give_back(self, nbytes: int) -> None:
        with self._lock:
            self.used = max(0, self.used - nbytes)


@dataclass
class KeptTensors:
    """The inputs and output gradients of an accumulator's backward requests, one pair
    per receipt, in the order of its receipts (a batch of several requests is split by
    their receipts' ``samples``: views, no copies)."""

    pairs: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    nbytes: int = 0
    #: False once anything behind the sums was not kept: it cannot be revealed
    complete: bool = True

    def keep(
        self,
        budget: KeptBudget | None,
        inputs: torch.Tensor,
        grads: torch.Tensor,
        receipts: Sequence[Any],
    ) -> None:
        if not self.complete:
            return
        rows = sum(getattr(r, "samples", 0) for r in receipts)
        nbytes = _nbytes(inputs) + _nbytes(grads)
        aligned = bool(receipts) and all(r is not None for r in receipts)
        if budget is None or not aligned or rows != inputs.shape[0] or not budget.take(nbytes):
            self.drop(budget)
            return
        inputs, grads, at = inputs.detach().cpu(), grads.detach().cpu(), 0
        for r in receipts:
            self.pairs.append((inputs[at : at + r.samples], grads[at : at + r.samples]))
            at += r.samples
        self.nbytes += nbytes

    def drop(self, budget: KeptBudget | None) -> None:
        """Forget the tensors (and give their bytes back): nothing can be revealed."""
        if budget is not None:
            budget.give_back(self.nbytes)
        self.pairs, self.nbytes, self.complete = [], 0, False


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
