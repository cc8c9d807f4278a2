"""The packed loader beside NumPy reading the same token shards, and its memory on a
dataset ten times larger. One JSON line:

- ``loader_tokens_per_s``: PackedLoader streaming packed batches (shuffled windows, a
  mixture of two sources, int64 tensors, ids checked) on one core, beside
  ``raw_read_tokens_per_s``: NumPy alone (``np.load`` memory-mapped) reading windows of
  the same size at random offsets of the same shards into int64 (goal: >= 0.5 of it);
  ``raw_sequential_tokens_per_s``: NumPy reading them front to back, for scale;
- ``loader_rss_mb_1x`` / ``loader_rss_mb_10x``: the peak resident memory of a process
  streaming the same number of batches from a dataset of N and of 10 N tokens (goal:
  within 10% of each other). Each figure is the median of three fresh processes.

    python benchmarks/data_loader.py [--tokens 20000000] [--batches 400]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VOCAB = 4096
CONTEXT = 1024
BATCH = 16


def make_shards(folder: Path, tokens: int, *, seed: int) -> Path:
    """Random ids in shards of 8M tokens, written a shard at a time (as prepare does)."""
    from core.data.shards import ShardWriter

    writer = ShardWriter(
        folder, vocab_size=VOCAB, eos_id=0, tokenizer="r" * 64, shard_tokens=8 * 1024 * 1024
    )
    rng = np.random.default_rng(seed)
    left = tokens
    while left > 0:
        n = min(left, 1024 * 1024) - 1  # a "document" of a million tokens and its EOS
        writer.add(rng.integers(1, VOCAB, size=n, dtype=np.int64))
        left -= n + 1
    writer.close()
    return folder


def stream(folders: list[str], batches: int) -> dict[str, float]:
    """In this process: the loader's tokens per second and peak RSS."""
    import torch

    from core.data.loader import PackedLoader, SourceSpec

    torch.set_num_threads(1)
    specs = [SourceSpec(Path(folders[0]), 3.0), SourceSpec(Path(folders[1]), 1.0)]
    loader = PackedLoader(specs, CONTEXT, BATCH, vocab_size=VOCAB, seed=1)
    loader.next_batch()
    started = time.perf_counter()
    for _ in range(batches):
        loader.next_batch()
    seconds = time.perf_counter() - started
    loader.close()
    return {
        "tokens_per_s": batches * BATCH * CONTEXT / seconds,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def raw_read(folders: list[str], tokens: int, *, sequential: bool) -> float:
    """NumPy alone reading ``tokens`` of the same shards into int64: windows of the
    loader's size at random offsets (the reads a shuffled loader must make), or
    (``sequential``) front to back in batch-sized pieces."""
    arrays = [
        np.load(path, mmap_mode="r")
        for folder in folders
        for path in sorted(Path(folder).glob("*.npy"))
    ]
    rng = np.random.default_rng(0)
    window = CONTEXT + 1
    started, done = time.perf_counter(), 0
    if sequential:
        while done < tokens:
            for array in arrays:
                for start in range(0, array.shape[0] - window * BATCH, window * BATCH):
                    done += np.asarray(array[start : start + window * BATCH], np.int64).size
                    if done >= tokens:
                        break
                if done >= tokens:
                    break
    else:
        while done < tokens:
            batch = np.empty((BATCH, window), dtype=np.int64)
            for j in range(BATCH):
                array = arrays[int(rng.integers(len(arrays)))]
                start = int(rng.integers(array.shape[0] - window))
                batch[j] = array[start : start + window]
            done += batch.size
    return done / (time.perf_counter() - started)


def child(args: list[str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=20_000_000)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--child", nargs="*")
    args = parser.parse_args()
    if args.child is not None:
        kind, batches, *folders = args.child
        if kind == "stream":
            print(json.dumps(stream(folders, int(batches))))
        else:
            tokens = int(batches) * BATCH * (CONTEXT + 1)
            rate = raw_read(folders, tokens, sequential=kind == "sequential")
            print(json.dumps({"tokens_per_s": rate}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        one = [make_shards(Path(tmp, f"1x-{i}"), args.tokens // 2, seed=i) for i in range(2)]
        ten = [make_shards(Path(tmp, f"10x-{i}"), 5 * args.tokens, seed=9 + i) for i in range(2)]
        small = [str(p) for p in one]
        large = [str(p) for p in ten]
        # each figure the median of three fresh processes, the kinds taking turns (a
        # noisy machine slows one run, not one kind)
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in ("loader", "raw", "seq", "10x")}
        for _ in range(3):
            runs["loader"].append(child(["stream", str(args.batches), *small]))
            runs["raw"].append(child(["raw", str(args.batches), *small]))
            runs["seq"].append(child(["sequential", str(args.batches), *small]))
            runs["10x"].append(child(["stream", str(args.batches), *large]))
        loader, raw, sequential, large_run = (
            {key: statistics.median(r[key] for r in runs[kind]) for key in runs[kind][0]}
            for kind in ("loader", "raw", "seq", "10x")
        )
    print(
        json.dumps(
            {
                "benchmark": "data_loader",
                "tokens_1x": args.tokens,
                "tokens_10x": 10 * args.tokens,
                "context": CONTEXT,
                "batch": BATCH,
                "batches": args.batches,
                "loader_tokens_per_s": round(loader["tokens_per_s"]),
                "raw_read_tokens_per_s": round(raw["tokens_per_s"]),
                "loader_vs_raw": round(loader["tokens_per_s"] / raw["tokens_per_s"], 3),
                "raw_sequential_tokens_per_s": round(sequential["tokens_per_s"]),
                "loader_rss_mb_1x": round(loader["rss_mb"], 1),
                "loader_rss_mb_10x": round(large_run["rss_mb"], 1),
                "loader_10x_tokens_per_s": round(large_run["tokens_per_s"]),
            }
        )
    )


if __name__ == "__main__":
    main()
