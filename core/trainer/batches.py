"""Where a trainer's batches come from, whatever the model's family: the byte model's
in-memory corpus (core/trainer/data.py) or packed windows of token shards
(core/data/loader.py), behind one face that the session draws from, evaluates on and
saves in its checkpoint.

A ``mixtral`` project reads token shards. Given text instead (a folder, ``.jsonl``,
``.parquet``, a saved dataset, or the standard library's sources), the trainer tokenizes
it once into shards in its work folder with the project's tokenizer, as ``moehome owner
prepare`` would, and reads those; a later run finds them there.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from core.data.documents import Document, DocumentSource, TextFiles, open_documents
from core.data.errors import DataError
from core.data.loader import PackedLoader, SourceSpec
from core.data.prepare import prepare
from core.data.shards import INDEX, ShardIndex
from core.data.tokenizer import (
    BYTES,
    TOKENIZER_FILE,
    ByteTokenizer,
    HFTokenizer,
    TextTokenizer,
    check_vocab,
)
from core.trainer.data import STDLIB, Corpus, bundled_corpus, sample_batch, stdlib_sources
from core.trainer.data import validation_batches as corpus_validation

log = logging.getLogger(__name__)


class Batches(Protocol):
    """Training batches in an order a checkpoint restores, and fixed held-out batches."""

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]: ...

    def validation_batches(self, batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class DataDescription:
    """What the trainer says about its data as it starts."""

    source: str
    bytes: int
    files: int
    tokens: int | None = None


class CorpusBatches:
    """The byte model's batches: random windows of an in-memory corpus, drawn by a
    seeded generator (its state is the cursor)."""

    def __init__(self, corpus: Corpus, batch_size: int, context: int, seed: int) -> None:
        self.corpus = corpus
        self.batch_size = batch_size
        self.context = context
        self.generator = torch.Generator().manual_seed(seed)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return sample_batch(self.corpus.train, self.batch_size, self.context, self.generator)

    def validation_batches(self, batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return corpus_validation(self.corpus.validation, self.batch_size, self.context, batches)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.generator.get_state().numpy().tobytes()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rng = np.frombuffer(bytes(state["rng"]), dtype=np.uint8).copy()
        self.generator.set_state(torch.from_numpy(rng))

    def describe(self) -> DataDescription:
        return DataDescription(self.corpus.source, self.corpus.total_bytes, self.corpus.files)


def describe_loader(loader: PackedLoader) -> DataDescription:
    sources = [s.spec.path for s in loader.sources]
    return DataDescription(
        source=", ".join(str(p) for p in sources),
        bytes=sum(f.path.stat().st_size for s in loader.sources for f in s.files),
        files=sum(len(s.files) for s in loader.sources),
        tokens=sum(s.tokens for s in loader.sources),
    )


def parse_source(text: str) -> SourceSpec:
    """``PATH`` or ``PATH@WEIGHT`` (a source of a weighted mixture)."""
    path, at, weight = text.rpartition("@")
    if not at or not _is_number(weight):
        return SourceSpec(Path(text))
    return SourceSpec(Path(path), float(weight))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def is_token_data(path: Path) -> bool:
    """Shards made by ``owner prepare``, a folder of token files, or one token file."""
    if path.is_file():
        return path.suffix in (".npy", ".bin")
    return (path / INDEX).is_file() or any(
        p.suffix in (".npy", ".bin") for p in path.glob("*") if p.is_file()
    )


def shard_folders(data: Sequence[str]) -> list[Path]:
    """The folders of token shards among a trainer's ``--data`` (where a tokenizer.json
    kept beside them is looked for)."""
    paths = [parse_source(item).path for item in data]
    return [p for p in paths if p.is_dir() and is_token_data(p)]


def project_tokenizer(pinned: str, given: Path | None, sources: Sequence[Path]) -> TextTokenizer:
    """The project's tokenizer: bytes, or a ``tokenizer.json`` whose sha256 is the
    manifest's pin, from ``--tokenizer`` or beside the shards."""
    if pinned == BYTES:
        return ByteTokenizer()
    candidates = [given] if given is not None else [s / TOKENIZER_FILE for s in sources]
    for path in candidates:
        if path is not None and path.is_file():
            return HFTokenizer.load(path, pinned)
    raise DataError(
        f"the project pins tokenizer {pinned[:12]}...: give its tokenizer.json with "
        "--tokenizer (or keep it beside the shards, as owner prepare does)"
    )


class _StandardLibrary(TextFiles):
    """The standard library's sources (or the bundle's copy), each file a document; the
    few that are not UTF-8 (tests of other encodings) are left out, as the byte model's
    corpus leaves them."""

    def __init__(self) -> None:
        files = bundled_corpus() or stdlib_sources()
        if not files:
            raise DataError("this Python has no standard library sources to train on")
        self.path = Path(STDLIB)
        self.files = files

    def _documents(self) -> Iterator[Document]:
        for path in self.files:
            try:
                pieces = list(self._pieces(path))
            except DataError as exc:
                log.debug("left out of the standard library's text: %s", exc)
                continue
            yield from pieces


class BudgetedText(DocumentSource):
    """The first ``max_bytes`` of text of ``data`` (or of the standard library)."""

    def __init__(self, data: str, fmt: str | None, field: str, max_bytes: int) -> None:
        super().__init__(Path(data))
        self.source: DocumentSource = (
            _StandardLibrary() if data == STDLIB else open_documents(Path(data), fmt, field)
        )
        self.max_bytes = max_bytes

    def _documents(self) -> Iterator[Document]:
        taken = 0
        for document in self.source:
            if taken >= self.max_bytes:
                return
            taken += len(document.text.encode("utf-8"))
            yield document

    def describe(self) -> str:
        return f"{self.source.describe()} (at most {self.max_bytes:,} bytes)"


def prepared_shards(
    data: str,
    tokenizer: TextTokenizer,
    workdir: Path,
    *,
    max_bytes: int,
    fmt: str | None = None,
    field: str = "text",
) -> Path:
    """Text tokenized into shards under ``workdir/data`` (once: a later run with the same
    data, budget and tokenizer finds them)."""
    where = str(data if data == STDLIB else Path(data).resolve())
    key = hashlib.sha256(f"{where}\0{max_bytes}\0{tokenizer.sha256}\0{field}".encode()).hexdigest()
    out = workdir / "data" / key[:16]
    if (out / INDEX).is_file():
        return out
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    log.info("tokenizing %s into %s (once)", data, out)

    index: ShardIndex = prepare(BudgetedText(data, fmt, field, max_bytes), tokenizer, partial)
    if index.tokens == 0:
        raise DataError(f"{data}: no text in it")
    partial.rename(out)
    return out


def open_batches(
    specs: Sequence[SourceSpec],
    *,
    tokenizer: TextTokenizer,
    vocab_size: int,
    context: int,
    batch_size: int,
    seed: int,
    rank: int,
    world: int,
) -> PackedLoader:
    """The loader of this trainer's share (``rank`` of ``world``)."""
    check_vocab(tokenizer, vocab_size, "the project's tokenizer")
    return PackedLoader(
        list(specs),
        context=context,
        batch_size=batch_size,
        vocab_size=vocab_size,
        seed=seed,
        rank=rank,
        world=world,
        tokenizer=tokenizer.sha256,
    )


def training_batches(
    model_architecture: str,
    vocab_size: int,
    pinned_tokenizer: str,
    data: Sequence[str],
    *,
    tokenizer_file: Path | None,
    workdir: Path,
    max_bytes: int,
    context: int,
    batch_size: int,
    seed: int,
    rank: int = 0,
    world: int = 1,
) -> tuple[Batches, DataDescription, TextTokenizer | None]:
    """A trainer's batches (its share: ``rank`` of ``world`` trainers), what to say
    about them, and the project's tokenizer (None for the byte model, which has none)."""
    from core.trainer.data import load_corpus

    if not data:
        raise DataError("no training data given")
    if model_architecture == "byte":
        if len(data) > 1:
            raise DataError("the byte model reads one folder or file of text (one --data)")
        corpus = load_corpus(data[0], max_bytes=max_bytes)
        batches = CorpusBatches(corpus, batch_size, context, seed + 1_000_003 * rank)
        return batches, batches.describe(), None
    specs = [parse_source(item) for item in data]
    tokenizer = project_tokenizer(pinned_tokenizer, tokenizer_file, shard_folders(data))
    check_vocab(tokenizer, vocab_size, "model.vocab_size")
    if isinstance(tokenizer, HFTokenizer):
        kept = workdir / TOKENIZER_FILE
        if not kept.is_file():
            workdir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tokenizer.path, kept)
    ready = [
        s
        if str(s.path) != STDLIB and s.path.exists() and is_token_data(s.path)
        else SourceSpec(
            prepared_shards(str(s.path), tokenizer, workdir, max_bytes=max_bytes), s.weight
        )
        for s in specs
    ]
    loader = open_batches(
        ready,
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        context=context,
        batch_size=batch_size,
        seed=seed,
        rank=rank,
        world=world,
    )
    return loader, describe_loader(loader), tokenizer
