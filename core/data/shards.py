"""Token shards: a dataset tokenized once (``moehome owner prepare``) and read by every
trainer without holding it in memory.

A shard set is a folder: ``shards.json`` (what the shards hold and how they were made)
and shards ``NNNNN.npy``, each a 1-D array of token ids in NumPy's own file format
(``uint16`` when the vocabulary fits, else ``uint32``), read memory-mapped. Documents
follow each other in a shard, each ended by the tokenizer's end-of-text id, so a window
cut anywhere packs whole documents and parts of documents into the context.

Token files made by other tools are read too: a bare ``.npy`` file or a raw ``.bin``
(little-endian, its dtype said by the caller, as nanoGPT and Prime's loaders write them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np
from numpy.typing import NDArray

from core.data.errors import DataError
from core.files import replace_file

INDEX: Final = "shards.json"
FORMAT: Final = "moehome-token-shards/1"
#: Tokens per shard a writer aims at (a few hundred MB of uint16 at most).
SHARD_TOKENS: Final = 128 * 1024 * 1024
DTYPES: Final = {"uint16": np.uint16, "uint32": np.uint32}

TokenArray = NDArray[np.uint16] | NDArray[np.uint32]


def dtype_for(vocab_size: int) -> str:
    """The smallest dtype that holds every id of a vocabulary."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


@dataclass(frozen=True)
class ShardIndex:
    """What ``shards.json`` says."""

    dtype: str
    vocab_size: int
    eos_id: int
    #: sha256 of the tokenizer file that made the shards ("bytes" for the byte tokenizer)
    tokenizer: str
    shards: tuple[tuple[str, int], ...]  # (file name, tokens)
    documents: int = 0
    source: str = ""

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.shards)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "dtype": self.dtype,
                "vocab_size": self.vocab_size,
                "eos_id": self.eos_id,
                "tokenizer": self.tokenizer,
                "documents": self.documents,
                "source": self.source,
                "shards": [{"file": name, "tokens": n} for name, n in self.shards],
            },
            indent=1,
        )

    @staticmethod
    def read(folder: Path) -> ShardIndex:
        path = folder / INDEX
        try:
            raw = json.loads(path.read_text())
            if raw.get("format") != FORMAT:
                raise DataError(f"{path}: not a moehome shard index (format {raw.get('format')!r})")
            dtype = str(raw["dtype"])
            if dtype not in DTYPES:
                raise DataError(f"{path}: dtype {dtype!r} is neither uint16 nor uint32")
            return ShardIndex(
                dtype=dtype,
                vocab_size=int(raw["vocab_size"]),
                eos_id=int(raw["eos_id"]),
                tokenizer=str(raw["tokenizer"]),
                documents=int(raw.get("documents", 0)),
                source=str(raw.get("source", "")),
                shards=tuple((str(s["file"]), int(s["tokens"])) for s in raw["shards"]),
            )
        except FileNotFoundError:
            raise DataError(
                f"{folder}: no {INDEX}; make shards with `moehome owner prepare`"
            ) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{path}: unreadable shard index ({exc})") from exc


@dataclass
class ShardWriter:
    """Appends documents' tokens to shards of about ``shard_tokens``; ``close`` writes the
    index last, so a folder with an index is whole."""

    folder: Path
    vocab_size: int
    eos_id: int
    tokenizer: str
    source: str = ""
    shard_tokens: int = SHARD_TOKENS
    _pending: list[NDArray[np.int64]] = field(default_factory=list)
    _pending_tokens: int = 0
    _shards: list[tuple[str, int]] = field(default_factory=list)
    documents: int = 0

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if (self.folder / INDEX).exists():
            raise DataError(f"{self.folder} already holds shards; choose an empty folder")
        self.dtype = dtype_for(self.vocab_size)

    def add(self, ids: Iterable[int]) -> None:
        """One document's ids; the end-of-text id is appended here. An empty document is
        skipped (it would be an end-of-text alone)."""
        array = np.fromiter(ids, dtype=np.int64)
        if not array.size:
            return
        self._pending.append(np.append(array, self.eos_id))
        self._pending_tokens += array.size + 1
        self.documents += 1
        if self._pending_tokens >= self.shard_tokens:
            self._flush()

    def _flush(self) -> None:
        if not self._pending_tokens:
            return
        tokens = np.concatenate(self._pending)
        if tokens.min() < 0 or tokens.max() >= self.vocab_size:
            raise DataError(
                f"token id {int(tokens.max())} is outside the vocabulary of {self.vocab_size}"
            )
        name = f"{len(self._shards):05d}.npy"
        partial = self.folder / (name + ".partial")
        with partial.open("wb") as out:
            np.save(out, tokens.astype(DTYPES[self.dtype]))
            out.flush()
            os.fsync(out.fileno())
        partial.replace(self.folder / name)
        self._shards.append((name, int(tokens.size)))
        self._pending, self._pending_tokens = [], 0

    def close(self) -> ShardIndex:
        self._flush()
        if not self._shards:
            raise DataError(f"no document had any text: {self.source or self.folder}")
        index = ShardIndex(
            dtype=self.dtype,
            vocab_size=self.vocab_size,
            eos_id=self.eos_id,
            tokenizer=self.tokenizer,
            shards=tuple(self._shards),
            documents=self.documents,
            source=self.source,
        )
        replace_file(self.folder / INDEX, index.to_json())
        return index


@dataclass(frozen=True)
class TokenFile:
    """One file of token ids, memory-mapped (pages are read when a window needs them)."""

    path: Path
    tokens: TokenArray

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


def open_tokens(path: Path, dtype: str | None = None) -> TokenFile:
    """A ``.npy`` file (its dtype in its header) or a raw ``.bin`` of ``dtype``."""
    try:
        if path.suffix == ".npy":
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        else:
            if dtype not in DTYPES:
                raise DataError(f"{path}: a raw token file needs its dtype (uint16 or uint32)")
            array = np.memmap(path, dtype=DTYPES[dtype], mode="r")
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a token file ({exc})") from exc
    if array.ndim != 1 or array.dtype not in (np.uint16, np.uint32):
        raise DataError(
            f"{path}: token files hold one row of uint16 or uint32, not {array.dtype} {array.shape}"
        )
    return TokenFile(path, array)


def open_shards(
    source: Path, dtype: str | None = None
) -> tuple[list[TokenFile], ShardIndex | None]:
    """The token files of a shard set folder (with its index), of a folder of ``.npy`` /
    ``.bin`` files, or of one such file."""
    if source.is_file():
        return [open_tokens(source, dtype)], None
    if (source / INDEX).exists():
        index = ShardIndex.read(source)
        files = [open_tokens(source / name, index.dtype) for name, _ in index.shards]
        for file, (_, count) in zip(files, index.shards, strict=True):
            if file.size != count:
                raise DataError(f"{file.path}: {file.size} tokens, the index says {count}")
        return files, index
    found = sorted(p for p in source.glob("*") if p.suffix in (".npy", ".bin"))
    if not found:
        raise DataError(f"{source}: no token files (.npy, .bin) and no {INDEX}")
    return [open_tokens(p, dtype) for p in found], None
