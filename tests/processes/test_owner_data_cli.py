"""The owner's data commands, run as the owner runs them: ``moehome owner tokenizer``
trains a BPE on a JSON-lines file and prints the sha256 a manifest pins; ``moehome owner
prepare`` makes shards the trainers' loader reads; bad data is one line and status 1."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from core.data.loader import PackedLoader, SourceSpec
from core.data.shards import ShardIndex

ROOT = Path(__file__).resolve().parents[2]
SENTENCE = "volunteers train experts of a model over the swarm while owners prepare data"


def moehome(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "MOEHOME_DATA_DIR": str(tmp_path / "data"),
        "MOEHOME_CONFIG_DIR": str(tmp_path / "config"),
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [sys.executable, "-m", "core.cli", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_tokenizer_then_prepare_make_shards_the_loader_reads(tmp_path: Path) -> None:
    words = SENTENCE.split()
    rows = [
        {"id": i, "text": " ".join(words[(i + k) % len(words)] for k in range(i % 17 + 5))}
        for i in range(300)
    ]
    data = tmp_path / "corpus.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))

    made = moehome(
        tmp_path, "owner", "tokenizer", "corpus.jsonl", "-o", "tok.json", "--vocab-size", "320"
    )
    assert made.returncode == 0, made.stderr
    sha = hashlib.sha256((tmp_path / "tok.json").read_bytes()).hexdigest()
    assert f"sha256:     {sha}" in made.stdout
    assert "vocab size: 3" in made.stdout

    prepared = moehome(
        tmp_path, "owner", "prepare", "corpus.jsonl", "-o", "shards", "--tokenizer", "tok.json"
    )
    assert prepared.returncode == 0, prepared.stderr
    assert "300 documents" in prepared.stdout
    assert "shards" in prepared.stdout.splitlines()[0]

    index = ShardIndex.read(tmp_path / "shards")
    assert (index.documents, index.tokenizer) == (300, sha)
    loader = PackedLoader(
        [SourceSpec(tmp_path / "shards")],
        context=16,
        batch_size=4,
        vocab_size=index.vocab_size,
        tokenizer=sha,
    )
    x, y = loader.next_batch()
    assert x.shape == y.shape == (4, 16)
    assert int(x.max()) < index.vocab_size


def test_a_missing_field_is_one_line_naming_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    run = moehome(tmp_path, "owner", "prepare", "bad.jsonl", "-o", "shards", "--bytes")
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: bad.jsonl:2: no field 'text' (the fields are 'body'); choose one with --field"
    ], run.stderr
