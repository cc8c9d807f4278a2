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
from typing import Any, BinaryIO, Final

import numpy as np
from numpy.typing import NDArray

from core.data.errors import DataError
from core.files import replace_file

INDEX: Final = "shards.json"
_PREAD: Final = hasattr(os, "pread")  # not on Windows
FORMAT: Final = "moehome-token-shards/1"
#: Tokens per shard a writer aims at (a few hundred MB of uint16 at most).
SHARD_TOKENS: Final = 128 * 1024 * 1024
DTYPES: Final = {"uint16": np.uint16, "uint32": np.uint32}


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
    _pending: list[NDArray[np.integer[Any]]] = field(default_factory=list)
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
        if array.min() < 0 or array.max() >= self.vocab_size:
            bad = int(array.max()) if array.max() >= self.vocab_size else int(array.min())
            raise DataError(f"token id {bad} is outside the vocabulary of {self.vocab_size}")
        # kept in the shard's dtype until written: a shard's worth of int64 would be 1 GiB
        self._pending.append(np.append(array, self.eos_id).astype(DTYPES[self.dtype]))
        self._pending_tokens += array.size + 1
        self.documents += 1
        if self._pending_tokens >= self.shard_tokens:
            self._flush()

    def _flush(self) -> None:
        if not self._pending_tokens:
            return
        tokens = np.concatenate(self._pending)
        name = f"{len(self._shards):05d}.npy"
        partial = self.folder / (name + ".partial")
        with partial.open("wb") as out:
            np.save(out, tokens)
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


class TokenFile:
    """One file of token ids, read a window at a time. Nothing of it stays in memory: a
    memory map would keep every page that a random window touched (and its read-ahead),
    so the process would grow with the dataset."""

    def __init__(self, path: Path, dtype: np.dtype[Any], offset: int, size: int) -> None:
        self.path, self.dtype, self.offset, self.size = path, dtype, offset, size
        self._file: BinaryIO | None = None

    def read(self, start: int, count: int) -> NDArray[np.integer[Any]]:
        """Tokens ``start`` to ``start + count`` (fewer at the end of the file)."""
        if self._file is None:
            self._file = self.path.open("rb", buffering=0)  # one read per window, no more
        count = max(0, min(count, self.size - start))
        at, size = self.offset + start * self.dtype.itemsize, count * self.dtype.itemsize
        if _PREAD:  # one system call, no seek
            data = os.pread(self._file.fileno(), size, at)
        else:
            self._file.seek(at)
            data = self._file.read(size)
        return np.frombuffer(data, dtype=self.dtype)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __del__(self) -> None:  # a read-only handle: closing it late loses nothing
        self.close()


def _npy_layout(path: Path) -> tuple[np.dtype[Any], int, tuple[int, ...]]:
    """The dtype, data offset and shape of a ``.npy`` file, from its header alone."""
    with path.open("rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        return dtype, f.tell(), tuple(shape)


def open_tokens(path: Path, dtype: str | None = None) -> TokenFile:
    """A ``.npy`` file (its dtype in its header) or a raw ``.bin`` of ``dtype``."""
    try:
        if path.suffix == ".npy":
            found, offset, shape = _npy_layout(path)
        else:
            if dtype not in DTYPES:
                raise DataError(f"{path}: a raw token file needs its dtype (uint16 or uint32)")
            found, offset = np.dtype(DTYPES[dtype]).newbyteorder("<"), 0
            size, rest = divmod(path.stat().st_size, found.itemsize)
            if rest:
                raise DataError(f"{path}: its size is no whole number of {dtype} tokens")
            shape = (size,)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a token file ({exc})") from exc
    if len(shape) != 1 or found.kind != "u" or found.itemsize not in (2, 4):
        raise DataError(
            f"{path}: token files hold one row of uint16 or uint32, not {found} {shape}"
        )
    return TokenFile(path, found, offset, shape[0])


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
