"""Expert uids on a grid, as in Learning@home: ``<layer>.<i>.<j>`` (e.g. ``ffn.3.17``). Pure."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

_UID_RE: Final = re.compile(r"^([a-z][a-z0-9_-]{0,31})((?:\.\d{1,6})+)$")
MAX_DIMS: Final = 4


class UIDError(ValueError):
    pass


@dataclass(frozen=True, order=True)
class ExpertUID:
    layer: str
    coords: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> ExpertUID:
        match = _UID_RE.match(text)
        if match is None:
            raise UIDError(f"{text!r} is not an expert uid like 'ffn.3.17'")
        coords = tuple(int(c) for c in match.group(2).split(".")[1:])
        if len(coords) > MAX_DIMS:
            raise UIDError(f"{text!r} has more than {MAX_DIMS} grid coordinates")
        return cls(match.group(1), coords)

    def __str__(self) -> str:
        return ".".join([self.layer, *map(str, self.coords)])

    def prefixes(self) -> list[str]:
        """Every proper prefix, each ending in '.': ``ffn.3.17`` -> ``ffn.``, ``ffn.3.``."""
        return [
            ".".join([self.layer, *map(str, self.coords[:n])]) + "."
            for n in range(len(self.coords))
        ]


@dataclass(frozen=True)
class Grid:
    """A layer's expert grid: ``Grid("ffn", (4, 8))`` holds ``ffn.0.0`` .. ``ffn.3.7``."""

    layer: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        ExpertUID.parse(f"{self.layer}.0")  # validates the layer name
        if not 1 <= len(self.shape) <= MAX_DIMS or any(not 1 <= n <= 100_000 for n in self.shape):
            raise UIDError(f"grid shape {self.shape} must have 1-{MAX_DIMS} sizes of 1..100000")

    def __contains__(self, uid: object) -> bool:
        return (
            isinstance(uid, ExpertUID)
            and uid.layer == self.layer
            and len(uid.coords) == len(self.shape)
            and all(0 <= c < n for c, n in zip(uid.coords, self.shape, strict=True))
        )

    def __iter__(self) -> Iterator[ExpertUID]:
        for coords in itertools.product(*(range(n) for n in self.shape)):
            yield ExpertUID(self.layer, coords)

    def __len__(self) -> int:
        total = 1
        for n in self.shape:
            total *= n
        return total

    @property
    def root_prefix(self) -> str:
        return self.layer + "."
