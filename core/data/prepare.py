"""``moehome owner prepare``: documents tokenized once into token shards that every trainer
then reads without tokenizing (see core/data/shards.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Final

from core.data.documents import DocumentSource
from core.data.shards import SHARD_TOKENS, ShardIndex, ShardWriter
from core.data.tokenizer import TextTokenizer

log = logging.getLogger(__name__)

#: Documents encoded at once: the tokenizer's Rust side spreads a batch over the cores.
BATCH_DOCUMENTS: Final = 256
#: A batch is encoded early when its texts reach this size, so that a run of huge
#: documents does not hold hundreds of them in memory.
BATCH_BYTES: Final = 16 * 1024 * 1024


def prepare(
    source: DocumentSource,
    tokenizer: TextTokenizer,
    out: Path,
    *,
    on_progress: Callable[[int], None] | None = None,
    shard_tokens: int = SHARD_TOKENS,
) -> ShardIndex:
    """Tokenize every document of ``source`` into shards in the folder ``out``, each
    document ended by the tokenizer's end-of-text id. ``on_progress`` is told the UTF-8
    bytes of text done so far, after each batch. Raises :class:`DataError` (bad input,
    or ``out`` already holds shards)."""
    writer = ShardWriter(
        out,
        vocab_size=tokenizer.vocab_size,
        eos_id=tokenizer.eos_id,
        tokenizer=tokenizer.sha256,
        source=source.describe(),
        shard_tokens=shard_tokens,
    )
    done = 0
    texts: list[str] = []
    pending = 0

    def encode() -> None:
        nonlocal done, pending
        for ids in tokenizer.encode_batch(texts):
            writer.add(ids)
        done += pending
        texts.clear()
        pending = 0
        if on_progress is not None:
            on_progress(done)

    for document in source:
        texts.append(document.text)
        pending += len(document.text.encode("utf-8"))
        if len(texts) >= BATCH_DOCUMENTS or pending >= BATCH_BYTES:
            encode()
    if texts:
        encode()
    index = writer.close()
    log.debug(
        "%s: %d documents, %d tokens in %d shards",
        out,
        index.documents,
        index.tokens,
        len(index.shards),
    )
    return index
