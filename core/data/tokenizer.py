"""Tokenizers: bytes (ids 0-255, no file), or any Hugging Face ``tokenizer.json``, pinned by
the sha256 of its bytes; and a byte-level BPE trained on the owner's own data, offline.

``tokenizers`` is imported only when a tokenizer file is loaded or trained: it is one of
the owner's extras, and the byte tokenizer needs nothing.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

from core.data.errors import DataError
from core.files import replace_file

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

#: The end-of-text tokens of the common model families, in the order they are looked for:
#: GPT-2 and Qwen, Llama 2 and Mistral, others, Llama 3, chat templates.
EOS_TOKENS: Final = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|im_end|>")
#: What a BPE trained here calls its end-of-text token (GPT-2's name: tools know it).
TRAINED_EOS: Final = "<|endoftext|>"
#: The least vocabulary of a byte-level BPE: its 256 bytes and the end-of-text token.
MIN_BPE_VOCAB: Final = 256 + 1
BYTES: Final = "bytes"
#: What a project's tokenizer file is called: beside its manifest (``owner publish``
#: publishes it from there), beside token shards, in a trainer's work folder.
TOKENIZER_FILE: Final = "tokenizer.json"
#: Documents handed to the BPE trainer at once (its Rust side takes batches faster).
_TRAIN_BATCH: Final = 1000


class TextTokenizer(Protocol):
    """What making shards needs of a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def sha256(self) -> str:
        """The sha256 of the tokenizer file (what a manifest pins), or "bytes"."""
        ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class ByteTokenizer:
    """One token per UTF-8 byte (ids 0-255) and an end-of-text id after them: any text,
    no file, no training. The model's vocabulary of a byte-level project."""

    vocab_size: int = 257
    eos_id: int = 256
    sha256: str = BYTES

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(text.encode("utf-8")) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        # A window cut in the middle of a character decodes to a replacement character.
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def tokenizer_sha256(data: bytes) -> str:
    """What a manifest's ``[data] tokenizer`` pins of a tokenizer file: the sha256 of its
    bytes, hex."""
    return hashlib.sha256(data).hexdigest()


def _tokenizers() -> None:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        raise DataError(
            "tokenizer files need the tokenizers package: pip install 'moehome[owner]'"
        ) from None


class HFTokenizer:
    """A Hugging Face ``tokenizer.json``. Texts are encoded without the tokenizer's own
    special tokens (a Llama's BOS, say): documents are separated by the end-of-text id
    alone, the same for every tokenizer."""

    def __init__(self, tokenizer: Tokenizer, path: Path, sha256: str) -> None:
        self.tokenizer = tokenizer
        self.path = path
        self.sha256 = sha256
        # Some files leave holes in their ids: the largest id decides what must fit.
        ids = tokenizer.get_vocab(with_added_tokens=True).values()
        self.vocab_size = max(
            tokenizer.get_vocab_size(with_added_tokens=True), max(ids, default=-1) + 1
        )
        self.eos_id = self._eos()

    def _eos(self) -> int:
        for token in EOS_TOKENS:
            found = self.tokenizer.token_to_id(token)
            if found is not None:
                return found
        raise DataError(
            f"{self.path}: no end-of-text token (looked for {', '.join(EOS_TOKENS)}); "
            "documents need one to be told apart"
        )

    @staticmethod
    def load(path: Path, pinned_sha256: str | None = None) -> HFTokenizer:
        """The tokenizer in ``path``; when ``pinned_sha256`` is given, the file's bytes must
        have that sha256 (what the manifest pins). Raises :class:`DataError`."""
        _tokenizers()
        from tokenizers import Tokenizer

        try:
            data = path.read_bytes()
        except OSError as exc:
            raise DataError(f"{path}: cannot read the tokenizer ({exc.strerror or exc})") from None
        digest = tokenizer_sha256(data)
        if pinned_sha256 is not None and digest != pinned_sha256.lower():
            raise DataError(
                f"{path}: sha256 {digest[:12]}, the project pins {pinned_sha256[:12]}; "
                "this is not the project's tokenizer"
            )
        try:
            tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception for a bad file
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DataError(f"{path}: not a Hugging Face tokenizer.json ({first})") from None
        return HFTokenizer(tokenizer, path, digest)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # encode_batch_fast: the offsets the plain one computes are not needed here
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


def check_vocab(tokenizer: TextTokenizer, vocab_size: int, where: str) -> None:
    """The model's ``vocab_size`` (said at ``where``, a manifest say) must hold every id of
    the tokenizer; a larger one is fine (rows that are never used, or padding to a
    multiple of 64 for speed)."""
    if vocab_size < tokenizer.vocab_size:
        raise DataError(
            f"{where}: vocab_size {vocab_size} is smaller than the tokenizer's "
            f"{tokenizer.vocab_size}; set vocab_size to at least {tokenizer.vocab_size}"
        )


def _batches(documents: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(documents)
    while batch := list(islice(it, size)):
        yield batch


def train_bpe(documents: Iterable[str], vocab_size: int, out: Path) -> HFTokenizer:
    """A byte-level BPE (GPT-2's kind: every byte has a token, so any text encodes) of at
    most ``vocab_size`` tokens, learned from ``documents`` in one pass, written to
    ``out`` as a ``tokenizer.json``. Offline: nothing is downloaded."""
    if vocab_size < MIN_BPE_VOCAB:
        raise DataError(
            f"vocab_size {vocab_size} is too small: a byte-level BPE needs at least "
            f"{MIN_BPE_VOCAB} (256 bytes and the end-of-text token)"
        )
    _tokenizers()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # offsets that point at the text, for whoever loads the file with transformers
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[TRAINED_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_batches(documents, _TRAIN_BATCH), trainer)
    replace_file(out, tokenizer.to_str(pretty=True))
    trained = HFTokenizer.load(out)
    if trained.vocab_size < vocab_size:
        log.info(
            "the data gave %d tokens, fewer than the %d asked for", trained.vocab_size, vocab_size
        )
    return trained
