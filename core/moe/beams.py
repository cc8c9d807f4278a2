"""The beam search over an expert grid as tensor operations on the gate's device.

The same choice as :func:`core.moe.finder.advance_beams` applied sample by sample (the
reference, kept for tests and ``benchmarks/owner_scale.py``): at each grid dimension,
every beam is extended by each of its live next coordinates and the ``k`` best
candidates are kept, best score first, ties broken by the candidate's name. Scores are
summed in float64, as the reference sums Python floats, so both choose the same experts
whatever the gate's dtype.

Per dimension it costs a top-(k+1) over the dimension's scores and one over the beams'
candidates. Samples whose best k+1 candidates hold a tie (a gate of equal scores, as at
a zero initialization) are chosen again by a stable sort over their candidates in name
order: exact, and slower only for them. Liveness comes per dimension as a table of the
prefixes in the beams (``LevelAlive``); the finder fills it from the DHT between levels.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

#: flat indices of prefixes are int64: grids beyond this many experts are refused
MAX_EXPERTS = 2**62


@dataclass(frozen=True)
class Routing:
    """Each sample's chosen experts, best first: ``experts`` [B, k] are flat indices in
    the grid's row-major order (``Grid``'s iteration); ``valid`` [B, k] is False where
    fewer than k live experts were found (those slots hold 0)."""

    experts: torch.Tensor
    valid: torch.Tensor
    #: the chosen experts' summed scores [B, k], float64 (-inf where not valid)
    scores: torch.Tensor


@dataclass(frozen=True)
class LevelAlive:
    """The live next coordinates at one grid dimension: row ``i`` of ``table`` [U, n]
    belongs to the prefix whose flat index is ``prefixes[i]`` (sorted); prefixes not
    listed have none. ``every``: all coordinates of every prefix are alive (``table``
    holds that one row)."""

    prefixes: torch.Tensor
    table: torch.Tensor
    every: bool = False

    @classmethod
    def everything(cls, n: int, device: torch.device | None = None) -> LevelAlive:
        """Every coordinate of every prefix alive (a local model; the reference run)."""
        return cls(
            torch.empty(0, dtype=torch.long, device=device),
            torch.ones(1, n, dtype=torch.bool, device=device),
            every=True,
        )

    def shared_row(self, prefix: torch.Tensor, score: torch.Tensor) -> torch.Tensor | None:
        """The live coordinates of every beam (``prefix`` [B, kb], empty where ``score``
        is -inf) when they all have the same, else None."""
        if self.every:
            return self.table[0]
        if self.prefixes.numel() == 0 or not bool((self.table == self.table[0]).all()):
            return None
        if not bool((self._found(prefix) | ~torch.isfinite(score)).all()):
            return None  # a beam whose prefix has no live coordinates at all
        return self.table[0]

    def rows(self, prefix: torch.Tensor) -> torch.Tensor:
        """[..., n] the live coordinates of each prefix in ``prefix`` [...]."""
        if self.every:
            return self.table[0].expand(*prefix.shape, -1)
        if self.prefixes.numel() == 0:
            return self.table.new_zeros(*prefix.shape, self.table.shape[1])
        return self.table[self._position(prefix)] & self._found(prefix).unsqueeze(-1)

    def _position(self, prefix: torch.Tensor) -> torch.Tensor:
        pos = torch.searchsorted(self.prefixes, prefix.contiguous())
        return pos.clamp(max=self.prefixes.numel() - 1)

    def _found(self, prefix: torch.Tensor) -> torch.Tensor:
        return self.prefixes[self._position(prefix)] == prefix


#: prefix spaces up to this size find the beams' prefixes with a mask, not a sort
_MASK_PREFIXES = 1 << 20


def live_prefixes(prefix: torch.Tensor, score: torch.Tensor, count: int) -> torch.Tensor:
    """The distinct flat prefixes (of ``count`` possible) of the beams with a finite
    score, ascending: what a level's liveness must be looked up for."""
    live = prefix[torch.isfinite(score)]
    if count <= _MASK_PREFIXES:  # one pass over the beams, none over their order
        seen = torch.zeros(count, dtype=torch.bool, device=prefix.device)
        seen[live] = True
        return seen.nonzero().squeeze(1)
    unique: torch.Tensor = torch.unique_consecutive(live.sort().values)
    return unique


def alive_table(rows: Sequence[Iterable[int]], n: int) -> torch.Tensor:
    """[len(rows), n] with row i True at each coordinate of ``rows[i]`` (out of range
    ones left out): one scatter, not one per row."""
    flat = [i * n + c for i, coords in enumerate(rows) for c in coords if 0 <= c < n]
    table = torch.zeros(len(rows) * n, dtype=torch.bool)
    table[torch.tensor(flat, dtype=torch.long)] = True
    return table.view(len(rows), n)


@lru_cache(maxsize=64)
def _name_ranks(n: int, device: torch.device) -> torch.Tensor:
    """Coordinate ``c``'s place when 0..n-1 are sorted as the strings of uids sort them
    (``str(c)``: 10 before 2)."""
    ranks = torch.empty(n, dtype=torch.long)
    ranks[torch.tensor(sorted(range(n), key=str), dtype=torch.long)] = torch.arange(n)
    return ranks.to(device)


def name_rank(prefix: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """The place of each flat prefix index (of ``len(shape)`` coordinates) among all
    such prefixes sorted by name. Uid names compare coordinate by coordinate as strings
    (a coordinate ends at '.' or the name's end, both below any digit), so the place is
    the row-major index of the coordinates' string ranks."""
    rank = torch.zeros_like(prefix)
    rest = prefix
    scale = 1
    for n in reversed(shape):
        rank = rank + _name_ranks(n, prefix.device)[rest % n] * scale
        rest = rest // n
        scale *= n
    return rank


def start(batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sample's one beam at the grid's root: (prefix [B, 1], score [B, 1])."""
    return (
        torch.zeros(batch, 1, dtype=torch.long, device=device),
        torch.zeros(batch, 1, dtype=torch.float64, device=device),
    )


def step(
    prefix: torch.Tensor,
    score: torch.Tensor,
    scores: torch.Tensor,
    alive: LevelAlive,
    k: int,
    shape_before: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One grid dimension for every sample: beams (``prefix`` [B, kb] flat indices over
    ``shape_before``, ``score`` [B, kb] float64, -inf where empty) extended by their live
    coordinates with ``scores`` [B, n] -> the ``k`` best (prefix [B, k] flat over
    ``shape_before + (n,)``, score [B, k]), best first, ties by name."""
    batch, kb = prefix.shape
    n = scores.shape[1]
    # a gate's float32 (or 16-bit) scores order the same in float32 as in float64:
    # only sums need float64
    s = scores.detach()
    s = s if s.dtype == torch.float64 else s.float()
    row = alive.shared_row(prefix, score)
    width = min(k + 1, n)
    if row is not None:
        # every beam has the same live coordinates: each beam's best width of them
        # are the only ones of it that can be among the best width overall
        live_s = s if alive.every or bool(row.all()) else s.masked_fill(~row, float("-inf"))
        top_s, top_j = live_s.topk(width, dim=1)
        if bool(torch.isnan(top_s).any()):  # topk ranks NaN first: look only there
            s = s.masked_fill(torch.isnan(s), float("-inf"))  # a broken gate chooses nothing
            return step(prefix, score, s, alive, k, shape_before)
        if kb == 1:
            values, cand_j, cand_b = top_s.double() + score, top_j, torch.zeros_like(top_j)
        else:
            cand = score.unsqueeze(2) + top_s.double().unsqueeze(1)
            values, pos = cand.reshape(batch, kb * width).topk(min(k + 1, kb * width), dim=1)
            cand_b = pos // width
            cand_j = top_j.gather(1, pos % width)
    else:
        if bool(torch.isnan(s).any()):
            s = s.masked_fill(torch.isnan(s), float("-inf"))
        live = alive.rows(prefix)  # [B, kb, n]
        cand = (score.unsqueeze(2) + s.double().unsqueeze(1)).masked_fill(~live, float("-inf"))
        values, pos = cand.reshape(batch, kb * n).topk(min(k + 1, kb * n), dim=1)
        cand_b, cand_j = pos // n, pos % n
    new_prefix = _pad_index(prefix.gather(1, cand_b) * n + cand_j, k)[:, :k]
    tied = _tied(values)
    values = _pad(values, k)[:, :k]
    if bool(tied.any()):
        rows = tied.nonzero().squeeze(1)
        new_prefix[rows], values[rows] = _exact(
            prefix[rows], score[rows], s[rows].double(), alive, k, shape_before
        )
    return new_prefix, values


def _tied(values: torch.Tensor) -> torch.Tensor:
    """[B] whether a sample's sorted best values hold two equal finite ones."""
    if values.shape[1] < 2:
        return torch.zeros(values.shape[0], dtype=torch.bool, device=values.device)
    same = (values[:, 1:] == values[:, :-1]) & torch.isfinite(values[:, 1:])
    return same.any(dim=1)


def _pad(values: torch.Tensor, k: int) -> torch.Tensor:
    if values.shape[1] >= k:
        return values
    fill = values.new_full((values.shape[0], k - values.shape[1]), float("-inf"))
    return torch.cat([values, fill], dim=1)


def _pad_index(index: torch.Tensor, k: int) -> torch.Tensor:
    if index.shape[1] >= k:
        return index
    return torch.cat([index, index.new_zeros(index.shape[0], k - index.shape[1])], dim=1)


def _exact(
    prefix: torch.Tensor,
    score: torch.Tensor,
    s: torch.Tensor,
    alive: LevelAlive,
    k: int,
    shape_before: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step for a few samples by sorting all their candidates: laid out in name
    order, then a stable sort by score keeps equal scores in that order."""
    batch, kb = prefix.shape
    n = s.shape[1]
    live = alive.rows(prefix)
    cand = (score.unsqueeze(2) + s.unsqueeze(1)).masked_fill(~live, float("-inf"))
    names = name_rank(prefix, shape_before).unsqueeze(2) * n + _name_ranks(n, s.device)
    names = names.reshape(batch, kb * n)
    by_name = names.argsort(dim=1)
    cand = cand.reshape(batch, kb * n).gather(1, by_name)
    values, pos = cand.sort(dim=1, descending=True, stable=True)
    keep = min(k, kb * n)
    flat = by_name.gather(1, pos[:, :keep])
    chosen = prefix.gather(1, flat // n) * n + flat % n
    return _pad_index(chosen, k), _pad(values[:, :keep], k)


def finish(prefix: torch.Tensor, score: torch.Tensor) -> Routing:
    valid = torch.isfinite(score)
    return Routing(prefix.masked_fill(~valid, 0), valid, score)


def beam_search(
    per_dim: Sequence[torch.Tensor], k: int, alive: Sequence[LevelAlive] | None = None
) -> Routing:
    """The best ``k`` experts of every sample from each grid dimension's scores
    ``per_dim[d]`` [B, n_d], with ``alive[d]`` (default: everything alive)."""
    shape = [p.shape[1] for p in per_dim]
    if math.prod(shape) >= MAX_EXPERTS:
        raise ValueError(f"a grid of {shape} has too many experts to route")
    prefix, score = start(per_dim[0].shape[0], per_dim[0].device)
    for d, scores in enumerate(per_dim):
        level = alive[d] if alive is not None else LevelAlive.everything(shape[d], scores.device)
        prefix, score = step(prefix, score, scores, level, k, shape[:d])
    return finish(prefix, score)


def coordinates(experts: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Flat indices [...] -> grid coordinates [..., len(shape)]."""
    out = []
    rest = experts
    for n in reversed(shape):
        out.append(rest % n)
        rest = rest // n
    return torch.stack(out[::-1], dim=-1)
