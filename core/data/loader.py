"""Packed batches from token files of any size, each trainer reading its own share, in an
order that a checkpoint's few numbers restore.

Every source (a shard set, a folder of token files, one file) is cut into windows of
``context + 1`` tokens (inputs and next-token targets) laid end to end in each file; the
documents inside were ended by the end-of-text id when they were tokenized, so a window
packs whole documents and parts of documents. The last windows of a source are held out
for evaluation and never trained on.

The order is a permutation of a source's training windows that costs no memory: window
``(a * i + b) mod n`` at position ``i``, with ``a`` prime to ``n``, both drawn from the
seed and the epoch. Trainer ``rank`` of ``world`` takes positions ``rank``, ``rank +
world``, ... so that trainers never share a window within an epoch. Which source each row
of a batch comes from is drawn by the sources' weights from a generator seeded by (seed,
rank, step): the state to save is the step and each source's position and epoch.

Memory does not grow with the data: files are memory-mapped, and nothing is kept per
window or per document.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch
from numpy.typing import NDArray

from core.data.errors import DataError
from core.data.shards import ShardIndex, TokenFile, open_shards

Tokens = NDArray[np.integer[Any]]

#: The share of a source's windows held out for evaluation, and at most this many.
VALIDATION_FRACTION: Final = 0.005
VALIDATION_WINDOWS_MAX: Final = 256


@dataclass(frozen=True)
class SourceSpec:
    """A source of token files and its weight in the mixture."""

    path: Path
    weight: float = 1.0
    #: the dtype of raw ``.bin`` files ("uint16" or "uint32"); ``.npy`` files say theirs
    dtype: str | None = None


class TokenSource:
    """One source's files and the windows laid over them."""

    def __init__(self, spec: SourceSpec, context: int) -> None:
        if not spec.weight > 0 or not math.isfinite(spec.weight):
            raise DataError(f"{spec.path}: a source's weight must be a positive number")
        self.spec = spec
        self.files, self.index = open_shards(spec.path, spec.dtype)
        self.context = context
        counts = [max(0, (f.size - 1) // context) for f in self.files]
        self._starts = np.cumsum([0, *counts]).tolist()  # first window of each file
        total = int(self._starts[-1])
        if total < 2:
            raise DataError(
                f"{spec.path}: {sum(f.size for f in self.files):,} tokens make fewer than two "
                f"windows of {context + 1}; add data or shorten the context"
            )
        held = max(1, min(VALIDATION_WINDOWS_MAX, int(total * VALIDATION_FRACTION)))
        self.train_windows = total - held
        self.validation_windows = held

    @property
    def tokens(self) -> int:
        return sum(f.size for f in self.files)

    def window(self, k: int) -> tuple[Tokens, TokenFile]:
        """Window ``k`` (0 <= k < all windows): ``context + 1`` tokens, and its file."""
        f = bisect.bisect_right(self._starts, k) - 1
        start = (k - int(self._starts[f])) * self.context
        file = self.files[f]
        return file.read(start, self.context + 1), file


def _permutation(n: int, seed: int, epoch: int, source: int) -> tuple[int, int]:
    """(a, b) of the affine permutation i -> (a*i + b) mod n of an epoch."""
    digest = hashlib.sha256(f"moehome-order/{seed}/{epoch}/{source}".encode()).digest()
    a = int.from_bytes(digest[:8], "little") % n or 1
    while math.gcd(a, n) != 1:
        a = a % n + 1
    b = int.from_bytes(digest[8:16], "little") % n
    return a, b


@dataclass
class _Cursor:
    position: int = 0  # windows this trainer took from the source in this epoch
    epoch: int = 0


@dataclass
class PackedLoader:
    """Training batches of ``batch_size`` packed windows from a weighted mixture of
    sources, this trainer's share (``rank`` of ``world``); validation batches from the
    held-out ends."""

    specs: list[SourceSpec]
    context: int
    batch_size: int
    vocab_size: int
    seed: int = 0
    rank: int = 0
    world: int = 1
    #: the sha256 of the tokenizer the project pins; shards made by another are refused
    tokenizer: str | None = None
    step: int = 0
    sources: list[TokenSource] = field(init=False)
    _cursors: list[_Cursor] = field(init=False)

    def __post_init__(self) -> None:
        if not self.specs:
            raise DataError("no training data given")
        if not 0 <= self.rank < self.world:
            raise DataError(f"trainer {self.rank} of {self.world}: no such share")
        self.sources = [TokenSource(spec, self.context) for spec in self.specs]
        for source in self.sources:
            self._check_index(source.spec.path, source.index)
            if source.train_windows < self.world:
                raise DataError(
                    f"{source.spec.path}: {source.train_windows} windows cannot be shared by "
                    f"{self.world} trainers"
                )
        weights = np.array([s.spec.weight for s in self.sources], dtype=np.float64)
        self._weights = weights / weights.sum()
        self._cdf = np.cumsum(self._weights)
        self._cursors = [_Cursor() for _ in self.sources]
        self._orders: dict[int, tuple[int, int, int]] = {}  # source: (epoch, a, b)

    def _check_index(self, path: Path, index: ShardIndex | None) -> None:
        if index is None:
            return
        if index.vocab_size > self.vocab_size:
            raise DataError(
                f"{path}: its tokens come from a vocabulary of {index.vocab_size}, the model's "
                f"has {self.vocab_size}"
            )
        if self.tokenizer is not None and index.tokenizer != self.tokenizer:
            raise DataError(
                f"{path}: tokenized with another tokenizer ({index.tokenizer[:12]}, the project "
                f"pins {self.tokenizer[:12]}); prepare it again with the project's tokenizer"
            )

    # ------------------------------------------------------------------ training

    def _next_window(self, s: int) -> tuple[Tokens, TokenFile]:
        source, cursor = self.sources[s], self._cursors[s]
        n = source.train_windows
        i = self.rank + self.world * cursor.position
        if i >= n:
            cursor.epoch, cursor.position = cursor.epoch + 1, 0
            i = self.rank
        order = self._orders.get(s)
        if order is None or order[0] != cursor.epoch:
            order = self._orders[s] = (cursor.epoch, *_permutation(n, self.seed, cursor.epoch, s))
        _, a, b = order
        cursor.position += 1
        return source.window((a * i + b) % n)

    def _rows(self, windows: list[tuple[Tokens, TokenFile]]) -> torch.Tensor:
        """The windows as one int64 tensor, every id checked against the vocabulary."""
        rows = np.empty((len(windows), self.context + 1), dtype=np.int64)
        for j, (window, _) in enumerate(windows):
            rows[j] = window
        if int(rows.max()) >= self.vocab_size:
            j = int(np.argmax(rows.max(axis=1)))
            raise DataError(
                f"{windows[j][1].path}: token id {int(rows[j].max())} is outside the model's "
                f"vocabulary of {self.vocab_size}"
            )
        return torch.from_numpy(rows)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, ``[batch_size, context]`` int64 each."""
        if len(self.sources) == 1:
            picks = [0] * self.batch_size
        else:  # drawn from (seed, rank, step) alone: a resumed loader draws the same
            rng = np.random.Generator(
                # draws advance the counter's lowest word: (rank, step) in its highest
                # words keep each batch's stream apart from every other batch's
                np.random.Philox(key=self.seed, counter=[0, 0, self.rank, self.step])
            )
            picks = np.searchsorted(self._cdf, rng.random(self.batch_size), side="right").tolist()
        batch = self._rows([self._next_window(min(s, len(self.sources) - 1)) for s in picks])
        self.step += 1
        return batch[:, :-1], batch[:, 1:]

    # ------------------------------------------------------------------ evaluation

    def validation_batches(self, batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The same ``batches`` batches every time: held-out windows spread evenly over
        each source's end, as many of each source as its weight says."""
        rows = batches * self.batch_size
        counts = np.floor(self._weights * rows).astype(int)
        counts[np.argmax(self._weights)] += rows - counts.sum()
        windows: list[tuple[Tokens, TokenFile]] = []
        for source, count in zip(self.sources, counts, strict=True):
            first, held = source.train_windows, source.validation_windows
            for j in range(int(count)):
                windows.append(source.window(first + (j * held) // max(1, int(count))))
        stacked = self._rows(windows)
        size = self.batch_size
        parts = [stacked[i : i + size] for i in range(0, len(stacked), size)]
        return [(part[:, :-1], part[:, 1:]) for part in parts]

    def close(self) -> None:
        for source in self.sources:
            for file in source.files:
                file.close()

    # ------------------------------------------------------------------ resuming

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: a resumed loader goes on with the next batch."""
        return {
            "step": self.step,
            "seed": self.seed,
            "rank": self.rank,
            "world": self.world,
            "sources": [
                {"path": str(s.spec.path), "position": c.position, "epoch": c.epoch}
                for s, c in zip(self.sources, self._cursors, strict=True)
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = [str(s["path"]) for s in state["sources"]]
        given = [str(s.spec.path) for s in self.sources]
        if saved != given:
            raise DataError(
                f"the checkpoint read {saved}, this run is given {given}: resume with the "
                "same data, or start in a new --workdir"
            )
        if (state["rank"], state["world"]) != (self.rank, self.world):
            raise DataError(
                f"the checkpoint is trainer {state['rank']} of {state['world']}, this run "
                f"{self.rank} of {self.world}"
            )
        self.step, self.seed = int(state["step"]), int(state["seed"])
        self._cursors = [
            _Cursor(position=int(s["position"]), epoch=int(s["epoch"])) for s in state["sources"]
        ]
