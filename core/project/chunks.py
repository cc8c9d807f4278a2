"""Content-addressed chunks of weight files, the index that lists them, and the on-disk
chunk cache (bounded; least recently used chunks go first)."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from core.project.signed import canonical
from net.codec import pack, unpack_bounded

log = logging.getLogger(__name__)

CHUNK_BYTES: Final = 1024 * 1024
#: How long a store trusts its own count of the bytes on disk (its last count plus what
#: it put since) before counting the files again: other stores may write into the same
#: folder (a trainer's sharing and its final export, a second process), and their bytes
#: are seen at the next count.
RECOUNT_S: Final = 60.0
MAX_INDEX_BYTES: Final = 8 * 1024 * 1024
_HEX = set("0123456789abcdef")
#: The weights index's entry of the project's pinned ``tokenizer.json`` (``[data]
#: tokenizer``, a sha256): data that trainers and export fetch, never an expert's
#: weights. No expert's uid can be it (those are a grid's prefix and coordinates,
#: "ffn0.1.2"), and volunteers and aggregators fetch only their experts' uids.
TOKENIZER_ENTRY: Final = "tokenizer"


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def is_hash(text: object) -> bool:
    return isinstance(text, str) and len(text) == 64 and set(text) <= _HEX


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    size: int
    chunks: tuple[str, ...]


@dataclass(frozen=True)
class WeightsIndex:
    """uid -> the chunks of its safetensors file."""

    files: dict[str, FileEntry]

    def encode(self) -> bytes:
        return pack(
            canonical({uid: [e.sha256, e.size, list(e.chunks)] for uid, e in self.files.items()})
        )

    @property
    def sha256(self) -> str:
        return sha256_hex(self.encode())

    @classmethod
    def decode(cls, data: bytes) -> WeightsIndex:
        obj = unpack_bounded(data, MAX_INDEX_BYTES)
        if not isinstance(obj, dict) or len(obj) > 100_000:
            raise ValueError("a weights index is a table of at most 100000 files")
        files: dict[str, FileEntry] = {}
        for uid, entry in obj.items():
            if not (
                isinstance(entry, list)
                and len(entry) == 3
                and is_hash(entry[0])
                and isinstance(entry[1], int)
                and 0 <= entry[1] <= 64 * 2**30
                and isinstance(entry[2], list)
                and all(is_hash(c) for c in entry[2])
                and len(entry[2]) == -(-entry[1] // CHUNK_BYTES)
            ):
                raise ValueError(f"index entry of {uid!r} is malformed")
            files[uid] = FileEntry(entry[0], entry[1], tuple(entry[2]))
        return cls(files)


class ChunkStore:
    """Chunks on disk under their SHA-256. Writes are atomic; reads are verified, so a
    corrupted file is never served or used; the total size stays under ``max_bytes``.

    The total is counted from the files when the store first writes and then at most
    every ``RECOUNT_S`` seconds, or when its own count passes the cap; between, each
    write adds its size. Counting every file on every write made a volunteer's pulls
    slower the longer it ran (a scan of the whole cache per chunk: 14% of an emulated
    host's CPU at 32 volunteers)."""

    def __init__(
        self, root: Path, max_bytes: int = 8 * 2**30, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._clock = clock
        #: bytes on disk as of the last count, plus those put since (None: not counted)
        self._bytes: int | None = None
        self._counted_at = 0.0
        self._lock = threading.Lock()  # puts come from worker threads
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, digest: str) -> Path:
        if not is_hash(digest):
            raise ValueError(f"{digest!r} is not a SHA-256 hex digest")
        return self.root / digest[:2] / digest

    def __contains__(self, digest: object) -> bool:
        return is_hash(digest) and self._path(str(digest)).exists()

    def get(self, digest: str) -> bytes | None:
        path = self._path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if sha256_hex(data) != digest:
            log.warning("chunk %s is corrupt on disk; dropping it", digest[:12])
            path.unlink(missing_ok=True)
            return None
        os.utime(path)  # recently used
        return data

    def put(self, data: bytes, expected: str | None = None) -> str:
        digest = sha256_hex(data)
        if expected is not None and digest != expected:
            raise ValueError(f"chunk hashes to {digest[:12]}, expected {expected[:12]}")
        path = self._path(digest)
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            self._added(len(data), keep=digest)
        return digest

    def _added(self, size: int, *, keep: str) -> None:
        """Count ``size`` more bytes; trim when over the cap or due for a count."""
        with self._lock:
            due = self._bytes is None or self._clock() - self._counted_at >= RECOUNT_S
            if not due:
                assert self._bytes is not None
                self._bytes += size
                due = self._bytes > self.max_bytes
        if due:
            self.trim(keep={keep})

    def _files(self) -> list[tuple[float, int, Path]]:
        """(last used, size, path) of every chunk, each file looked at once."""
        out = []
        for p in self.root.glob("??/*"):
            if p.name.endswith(".tmp"):
                continue
            try:
                st = p.stat()
            except FileNotFoundError:  # trimmed by another store meanwhile
                continue
            out.append((st.st_mtime, st.st_size, p))
        return out

    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self._files())

    def trim(self, keep: Iterable[str] = ()) -> None:
        """Count the chunks on disk, and drop least recently used ones until the store
        fits its cap."""
        keep = set(keep)
        files = self._files()
        total = sum(size for _, size, _ in files)
        if total > self.max_bytes:
            for _, size, p in sorted(files, key=lambda f: f[0]):
                if total <= self.max_bytes:
                    break
                if p.name in keep:
                    continue
                total -= size
                p.unlink(missing_ok=True)
        with self._lock:
            self._bytes, self._counted_at = total, self._clock()


def split_file(data: bytes, store: ChunkStore) -> FileEntry:
    chunks = tuple(store.put(data[i : i + CHUNK_BYTES]) for i in range(0, len(data), CHUNK_BYTES))
    return FileEntry(sha256_hex(data), len(data), chunks)


def assemble(entry: FileEntry, store: ChunkStore) -> bytes | None:
    """The file of ``entry`` from stored chunks, or None if a chunk is missing."""
    parts = []
    for digest in entry.chunks:
        data = store.get(digest)
        if data is None:
            return None
        parts.append(data)
    blob = b"".join(parts)
    if len(blob) != entry.size or sha256_hex(blob) != entry.sha256:
        raise ValueError("chunks do not make the file the index describes")
    return blob
