"""Dispatch and combine as tensor operations: a routing's (sample, slot) pairs grouped
by expert, each expert's rows cut into calls, the calls' inputs gathered at once, their
answers written into one buffer in the same order and put back at once. No step loops
over samples; what loops over calls is the calls' own bookkeeping (they are network
requests: a task each)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from core.moe.beams import Routing


class Span(NamedTuple):
    """One call's pairs: ``start:stop`` of the dispatch's arrays (one expert's). A
    tuple: thousands are made per batch."""

    expert: int
    part: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Dispatch:
    """The valid (sample, slot) pairs of a routing, grouped by expert (ascending) and,
    within an expert, by sample (ascending). Host tensors: they index host buffers."""

    samples: int
    k: int
    rows: torch.Tensor  # [N] the sample of each pair
    slots: torch.Tensor  # [N] its place among the sample's k
    pairs: torch.Tensor  # [N] rows * k + slots: its place in a [samples * k] layout
    experts: list[int]  # the experts with pairs, ascending
    starts: list[int]  # where each one's pairs begin (and its end: the next start)

    @classmethod
    def of(cls, routing: Routing) -> Dispatch:
        experts = routing.experts.cpu()
        valid = routing.valid.cpu()
        samples, k = experts.shape
        if bool(valid.all()):  # the usual case: no mask to apply
            flat = experts.reshape(-1)
            pair = torch.arange(flat.numel())
        else:
            flat, pair = experts[valid], valid.reshape(-1).nonzero().squeeze(1)
        order = flat.argsort(stable=True)  # stable: samples stay ascending per expert
        chosen, counts = torch.unique_consecutive(flat.index_select(0, order), return_counts=True)
        starts = [0, *torch.cumsum(counts, 0).tolist()]
        pair = pair.index_select(0, order)
        return cls(samples, k, pair // k, pair % k, pair, chosen.tolist(), starts)

    def __len__(self) -> int:
        return int(self.rows.numel())

    def spans(self, parts: Callable[[int, int], int] | None = None) -> list[Span]:
        """Each expert's pairs as calls, in order: ``parts(expert, rows)`` of about
        equal size (default one; 0: no call)."""
        if parts is None:  # _make: thousands of spans per batch, a third faster than Span()
            bounds0 = zip(self.experts, itertools.repeat(0), self.starts, self.starts[1:])
            return list(map(Span._make, bounds0))
        cuts = []
        for expert, rows in self.expert_rows():
            n = parts(expert, rows)
            cuts.append([(part * rows // n, (part + 1) * rows // n) for part in range(n)])
        return self.spans_cut(cuts)

    def expert_rows(self) -> list[tuple[int, int]]:
        """Each expert with pairs, and how many, in order."""
        return [
            (e, b - a) for e, a, b in zip(self.experts, self.starts, self.starts[1:], strict=False)
        ]

    def spans_cut(self, cuts: Sequence[Sequence[tuple[int, int]]]) -> list[Span]:
        """Calls from ``cuts``: per expert (in :meth:`expert_rows`' order), the
        ``start:stop`` of its rows each call takes (none: no call)."""
        out = []
        for expert, start, pieces in zip(self.experts, self.starts, cuts, strict=False):
            for part, (a, b) in enumerate(pieces):
                out.append(Span(expert, part, start + a, start + b))
        return out

    def rows_of(self, span: Span) -> torch.Tensor:
        return self.rows[span.start : span.stop]

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every pair's input row of ``x`` [samples, ...], in dispatch order: one gather;
        a call takes its span of it (a view) when it sends."""
        return x.index_select(0, self.rows)

    def take(self, grouped: torch.Tensor, spans: Sequence[Span]) -> list[torch.Tensor]:
        """Views of ``grouped`` [N, ...] (a value per pair, in dispatch order) per span
        (spans in order, without gaps: one split)."""
        if spans and spans[0].start == 0 and spans[-1].stop == len(self):
            sizes = [s.rows for s in spans]
            if all(a.stop == b.start for a, b in itertools.pairwise(spans)):
                return list(torch.split(grouped, sizes))
        return [grouped[s.start : s.stop] for s in spans]

    def buffer(self, shape: Sequence[int], dtype: torch.dtype) -> Answers:
        """Where the calls' answers are written, in dispatch order."""
        return Answers(torch.zeros(len(self), *shape, dtype=dtype))

    def _answered(self, answers: Answers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows, pairs, values) of the answered pairs: a difference array marks the
        answered spans, no loop over them in torch (all of them: no indexing at all)."""
        if answers.rows == len(self):
            return self.rows, self.pairs, answers.values
        marks = torch.zeros(len(self) + 1, dtype=torch.int32)
        ones = torch.ones(len(answers.spans), dtype=torch.int32)
        starts = torch.tensor([s.start for s in answers.spans], dtype=torch.long)
        stops = torch.tensor([s.stop for s in answers.spans], dtype=torch.long)
        marks.index_add_(0, starts, ones).index_add_(0, stops, -ones)
        got = marks.cumsum(0)[:-1] > 0
        return self.rows[got], self.pairs[got], answers.values[got]

    def combine(self, answers: Answers) -> tuple[torch.Tensor, torch.Tensor]:
        """(outputs [samples, k, ...] holding each answered pair's row, alive
        [samples, k] 1.0 where an answer is): one copy by flat place for all answers;
        when every slot is answered, one gather and no zeros."""
        _, pairs, values = self._answered(answers)
        shape = (self.samples, self.k, *values.shape[1:])
        if pairs.numel() == self.samples * self.k:  # a permutation: gather by its inverse
            inverse = torch.empty_like(pairs).index_copy_(0, pairs, torch.arange(pairs.numel()))
            return values.index_select(0, inverse).view(shape), torch.ones(self.samples, self.k)
        outputs = values.new_zeros(self.samples * self.k, *values.shape[1:])
        alive = torch.zeros(self.samples * self.k)
        outputs.index_copy_(0, pairs, values)
        alive.index_fill_(0, pairs, 1.0)
        return outputs.view(shape), alive.view(self.samples, self.k)

    def scatter_add(self, answers: Answers, out: torch.Tensor) -> torch.Tensor:
        """``out`` [samples, ...] plus every answered pair's row added at its sample."""
        rows, _, values = self._answered(answers)
        return out.index_add_(0, rows, values.to(out.dtype))

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
        flat = per_sample_slot.reshape(self.samples * self.k, *per_sample_slot.shape[2:])
        return flat.index_select(0, self.pairs)


@dataclass
class Answers:
    """The calls' answers, a row per pair in dispatch order, and the spans answered
    (each once)."""

    values: torch.Tensor
    spans: list[Span] = field(default_factory=list)
    rows: int = 0  # of the spans answered

    def put(self, span: Span, value: torch.Tensor) -> None:
        self.values[span.start : span.stop] = value
        self.spans.append(span)
        self.rows += span.rows
