"""Dispatch and combine as tensor operations: a routing's (sample, slot) pairs grouped
by expert, each expert's rows cut into calls, the calls' inputs gathered at once and
their answers put back at once. No step loops over samples; the loops that remain go
over calls, which are network requests anyway."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from core.moe.beams import Routing


@dataclass(frozen=True)
class Span:
    """One call's pairs: ``start:stop`` of the dispatch's arrays (one expert's)."""

    expert: int
    part: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Dispatch:
    """The valid (sample, slot) pairs of a routing, grouped by expert (ascending) and,
    within an expert, by sample (ascending). Host tensors: they index host buffers."""

    samples: int
    k: int
    rows: torch.Tensor  # [N] the sample of each pair
    slots: torch.Tensor  # [N] its place among the sample's k
    experts: list[int]  # the experts with pairs, ascending
    starts: list[int]  # where each one's pairs begin (and its end: the next start)

    @classmethod
    def of(cls, routing: Routing) -> Dispatch:
        experts = routing.experts.cpu()
        valid = routing.valid.cpu()
        samples, k = experts.shape
        pairs = valid.nonzero()  # [N, 2] sample-major
        flat = experts[valid]
        order = flat.argsort(stable=True)  # stable: samples stay ascending per expert
        chosen, counts = torch.unique_consecutive(flat[order], return_counts=True)
        starts = [0, *torch.cumsum(counts, 0).tolist()]
        return cls(samples, k, pairs[order, 0], pairs[order, 1], chosen.tolist(), starts)

    def __len__(self) -> int:
        return int(self.rows.numel())

    def spans(self, parts: Callable[[int, int], int] | None = None) -> list[Span]:
        """Each expert's pairs as calls: ``parts(expert, rows)`` of about equal size
        (default one)."""
        out = []
        for i, expert in enumerate(self.experts):
            start, stop = self.starts[i], self.starts[i + 1]
            n = parts(expert, stop - start) if parts is not None else 1
            for part in range(n):
                out.append(
                    Span(
                        expert,
                        part,
                        start + part * (stop - start) // n,
                        start + (part + 1) * (stop - start) // n,
                    )
                )
        return out

    def rows_of(self, span: Span) -> torch.Tensor:
        return self.rows[span.start : span.stop]

    def gather(self, x: torch.Tensor, spans: Sequence[Span]) -> list[torch.Tensor]:
        """Each span's input rows of ``x`` [samples, ...]: one gather, then views."""
        if not spans:
            return []
        grouped = x[self.rows]
        return [grouped[s.start : s.stop] for s in spans]

    def _pairs(self, spans: Sequence[Span]) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, slots) of the pairs of ``spans`` (sorted by start, not overlapping),
        in that order: a difference array marks them, no loop over spans in torch."""
        if sum(len(s) for s in spans) == len(self):
            return self.rows, self.slots
        marks = torch.zeros(len(self) + 1, dtype=torch.int32)
        ones = torch.ones(len(spans), dtype=torch.int32)
        marks.index_add_(0, torch.tensor([s.start for s in spans], dtype=torch.long), ones)
        marks.index_add_(0, torch.tensor([s.stop for s in spans], dtype=torch.long), -ones)
        index = (marks.cumsum(0)[:-1] > 0).nonzero().squeeze(1)
        return self.rows[index], self.slots[index]

    def combine(
        self,
        answers: Mapping[Span, torch.Tensor],
        shape: Sequence[int],
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(outputs [samples, k, *shape] with each answered pair's rows, alive
        [samples, k] 1.0 where an answer is): one scatter for all answers."""
        outputs = torch.zeros(self.samples, self.k, *shape, dtype=dtype)
        alive = torch.zeros(self.samples, self.k)
        if answers:
            spans = sorted(answers, key=lambda s: s.start)
            rows, slots = self._pairs(spans)
            outputs[rows, slots] = torch.cat([answers[s].to(dtype) for s in spans])
            alive[rows, slots] = 1.0
        return outputs, alive

    def scatter_add(
        self,
        answers: Mapping[Span, torch.Tensor],
        out: torch.Tensor,
    ) -> torch.Tensor:
        """``out`` [samples, ...] plus every answer's rows added at their samples."""
        if answers:
            spans = sorted(answers, key=lambda s: s.start)
            rows, _ = self._pairs(spans)
            values = torch.cat([answers[s].to(out.dtype) for s in spans])
            out.index_add_(0, rows, values)
        return out

    def take(self, grouped: torch.Tensor, spans: Sequence[Span]) -> list[torch.Tensor]:
        """Views of ``grouped`` [N, ...] (a value per pair, in dispatch order) per span."""
        return [grouped[s.start : s.stop] for s in spans]

    def any_nonzero(self, grouped: torch.Tensor, spans: Sequence[Span]) -> list[bool]:
        """Per span, whether any of its values in ``grouped`` [N, ...] is not zero."""
        if not spans:
            return []
        nonzero = grouped.reshape(len(self), -1).ne(0).any(dim=1).to(torch.int64)
        before = torch.cat([nonzero.new_zeros(1), nonzero.cumsum(0)])
        starts = torch.tensor([s.start for s in spans], dtype=torch.long)
        stops = torch.tensor([s.stop for s in spans], dtype=torch.long)
        return (before[stops] > before[starts]).tolist()

    def per_pair(self, per_sample_slot: torch.Tensor) -> torch.Tensor:
        """[samples, k, ...] -> [N, ...] in dispatch order (one gather)."""
        return per_sample_slot[self.rows, self.slots]
