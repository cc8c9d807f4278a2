"""An exported model in use: loaded as ``transformers`` loads it, sampled, evaluated in
bits per byte (``moehome owner generate``, ``moehome owner eval``).

Bits per byte, not per token: models with different tokenizers then compare. A held-out
window's bytes are those of its targets decoded to text (UTF-8), its bits the sum of
the targets' cross-entropies over ln 2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from core.data.errors import DataError
from core.data.tokenizer import ByteTokenizer, HFTokenizer, TextTokenizer
from core.families.mixtral import FamilyError


def load_exported(folder: Path) -> tuple[PreTrainedModel, TextTokenizer]:
    """The model of an exported folder (``from_pretrained``, float32, eval mode) and its
    tokenizer (its tokenizer.json; bytes when it has none)."""
    if not (folder / "config.json").is_file():
        raise FamilyError(f"{folder}: no config.json; export a model first (moehome owner export)")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.train(False)
    tokenizer_file = folder / "tokenizer.json"
    tokenizer: TextTokenizer = (
        HFTokenizer.load(tokenizer_file) if tokenizer_file.is_file() else ByteTokenizer()
    )
    if tokenizer.vocab_size > model.config.vocab_size:
        raise FamilyError(
            f"{folder}: the tokenizer has {tokenizer.vocab_size} tokens, the model "
            f"{model.config.vocab_size}"
        )
    return model, tokenizer


def generate_text(
    model: PreTrainedModel,
    tokenizer: TextTokenizer,
    prompt: str,
    *,
    max_new_tokens: int = 100,
    temperature: float = 0.8,
    top_k: int = 50,
    seed: int = 0,
) -> str:
    """``prompt`` continued by sampling (greedy at temperature 0), at most to the
    model's context; the continuation alone."""
    ids = tokenizer.encode_batch([prompt])[0] or [tokenizer.eos_id]
    context = int(model.config.max_position_embeddings)
    ids = ids[-(context - 1) :]
    room = max(1, min(max_new_tokens, context - len(ids)))
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        with torch.no_grad():
            out = model.generate(  # type: ignore[operator]
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=room,
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_k=top_k if temperature > 0 else None,
                eos_token_id=tokenizer.eos_id,
                pad_token_id=tokenizer.eos_id,
            )
    finally:
        torch.random.set_rng_state(generator_state)
    new = [int(t) for t in out[0, len(ids) :] if int(t) != tokenizer.eos_id]
    return tokenizer.decode(new)


@dataclass(frozen=True)
class Evaluation:
    loss: float  # nats per token
    bits_per_byte: float
    tokens: int
    bytes: int


def evaluate(
    model: torch.nn.Module,
    tokenizer: TextTokenizer,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
) -> Evaluation:
    """Mean next-token loss and bits per byte of ``batches`` (inputs, targets)."""
    if not batches:
        raise DataError("no held-out batches to evaluate on")
    nats, tokens, size = 0.0, 0, 0
    with torch.no_grad():
        for x, y in batches:
            logits = model(x).logits
            losses = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), reduction="sum"
            )
            nats += float(losses)
            tokens += y.numel()
            size += sum(len(tokenizer.decode(row.tolist()).encode("utf-8")) for row in y)
    bits_per_byte = nats / math.log(2) / max(size, 1)
    return Evaluation(nats / tokens, bits_per_byte, tokens, size)
