"""The chunk cache's cap (core/project/chunks.py): kept without counting every file on
every write, and with the bytes of another store in the same folder seen at its next
count."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.project import chunks
from core.project.chunks import RECOUNT_S, ChunkStore

SIZE = 1000


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def chunk(i: int) -> bytes:
    return i.to_bytes(4, "little") * (SIZE // 4)


def fill(store: ChunkStore, first: int, count: int) -> list[str]:
    """Put ``count`` chunks, each used after the one before (mtimes one second apart)."""
    digests = []
    for i in range(first, first + count):
        digest = store.put(chunk(i))
        t = 1_000_000 + i
        os.utime(store._path(digest), (t, t))
        digests.append(digest)
    return digests


def counted_files(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the store looks at its files (a list to read after)."""
    counts: list[int] = []
    original = ChunkStore._files

    def spy(self: ChunkStore) -> list[tuple[float, int, Path]]:
        counts.append(1)
        return original(self)

    monkeypatch.setattr(chunks.ChunkStore, "_files", spy)
    return counts


def test_the_cap_holds_and_the_oldest_chunks_go(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path, max_bytes=5 * SIZE, clock=Clock())
    digests = fill(store, 0, 8)
    assert store.total_bytes() <= 5 * SIZE
    assert [d in store for d in digests] == [False] * 3 + [True] * 5
    assert store.get(digests[-1]) == chunk(7)


def test_writes_under_the_cap_do_not_count_the_files_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = counted_files(monkeypatch)
    clock = Clock()
    store = ChunkStore(tmp_path, max_bytes=100 * SIZE, clock=clock)
    fill(store, 0, 50)
    assert len(counts) == 1  # the first write counts what is there; the rest add
    store.put(chunk(0))  # a chunk it has: nothing written, nothing counted
    assert len(counts) == 1
    clock.now += RECOUNT_S
    fill(store, 50, 1)
    assert len(counts) == 2  # due for a count


def test_another_stores_bytes_are_seen_at_the_next_count(tmp_path: Path) -> None:
    clock = Clock()
    mine = ChunkStore(tmp_path, max_bytes=6 * SIZE, clock=clock)
    theirs = ChunkStore(tmp_path, max_bytes=6 * SIZE, clock=clock)
    fill(mine, 0, 3)
    fill(theirs, 3, 3)  # its first write counted mine: 6 chunks, at the cap
    assert mine.total_bytes() == 6 * SIZE
    fill(mine, 6, 1)  # mine counts 4 chunks of its own count: no trim yet
    assert mine.total_bytes() == 7 * SIZE
    clock.now += RECOUNT_S
    fill(mine, 7, 1)  # counted again: trimmed to the cap, the oldest first
    assert mine.total_bytes() == 6 * SIZE
    gone = [i for i in range(8) if chunks.sha256_hex(chunk(i)) not in mine]
    assert gone == [0, 1]


def test_its_own_count_over_the_cap_trims_at_once(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path, max_bytes=4 * SIZE, clock=Clock())
    fill(store, 0, 4)
    assert store.total_bytes() == 4 * SIZE
    fill(store, 4, 1)
    assert store.total_bytes() == 4 * SIZE
    assert chunks.sha256_hex(chunk(0)) not in store
    assert chunks.sha256_hex(chunk(4)) in store  # the chunk just written is kept
