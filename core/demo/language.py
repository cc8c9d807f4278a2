"""The demo's language: a BPE tokenizer learned from the demo's text and the text
tokenized into shards before the project is published (the manifest pins the
tokenizer), and, once trained, the model exported and sampled as an owner would
(``moehome owner export``, ``moehome owner generate``)."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from core.data.tokenizer import TOKENIZER_FILE, ByteTokenizer, TextTokenizer, train_bpe
from core.demo.options import DemoOptions
from core.demo.supervisor import Swarm
from core.trainer.batches import BudgetedText, prepared_shards

log = logging.getLogger(__name__)

#: Text the tokenizer learns from, and text tokenized for training: the demo trains on
#: 200 x 16 x 64 = 205k tokens, a few MB of text (the rest would wait unread).
TOKENIZER_TEXT_BYTES = 4 * 2**20
TRAINING_TEXT_BYTES = 8 * 2**20
#: The prompts the demo's model continues at the end.
PROMPTS = ("def ", "import ")


@dataclass(frozen=True)
class DemoLanguage:
    """The pinned tokenizer's sha256 (or bytes) and vocabulary, and the shards."""

    tokenizer: str
    vocab_size: int
    shards: Path


def demo_language(options: DemoOptions, folder: Path) -> DemoLanguage:
    """(Blocking.) The tokenizer and shards of a mixtral demo in ``folder``."""
    tokenizer: TextTokenizer
    if options.vocab_size == 0:
        tokenizer = ByteTokenizer()
        shards = prepared_shards(options.data, tokenizer, folder, max_bytes=TRAINING_TEXT_BYTES)
        return DemoLanguage(tokenizer.sha256, tokenizer.vocab_size, shards)
    texts = (d.text for d in BudgetedText(options.data, None, "text", TOKENIZER_TEXT_BYTES))
    tokenizer = train_bpe(texts, options.vocab_size, folder / TOKENIZER_FILE)
    shards = prepared_shards(options.data, tokenizer, folder, max_bytes=TRAINING_TEXT_BYTES)
    (shards / TOKENIZER_FILE).write_bytes((folder / TOKENIZER_FILE).read_bytes())
    return DemoLanguage(tokenizer.sha256, tokenizer.vocab_size, shards)


async def sample_text(
    swarm: Swarm,
    project: str,
    bootstrap: str,
    trainer_workdir: Path,
    prefix: Sequence[str] = (),
) -> str:
    """The trained model exported from the swarm and a few continuations of ``PROMPTS``
    sampled from it: the owner's commands, as processes (``prefix``: where the owner
    runs, in the network lab)."""
    out = swarm.root / "model"
    shutil.rmtree(out, ignore_errors=True)  # a resumed demo's earlier export
    await swarm.run_to_end(
        "export",
        [
            "owner",
            "export",
            "--project",
            project,
            "-b",
            bootstrap,
            "-o",
            str(out),
            "--workdir",
            str(trainer_workdir),
        ],
        prefix,
    )
    prompts = [word for prompt in PROMPTS for word in ("--prompt", prompt)]
    text = await swarm.run_to_end(
        "generate", ["owner", "generate", str(out), *prompts, "--tokens", "40", "--seed", "1"]
    )
    return text.rstrip()
