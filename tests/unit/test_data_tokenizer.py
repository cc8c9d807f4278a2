"""Tokenizers: a byte-level BPE trained here, offline, round-trips any text; a tokenizer
file is pinned by its sha256 and another file is refused; the model's vocabulary must hold
the tokenizer's; the end-of-text token is found; bytes need no file. And ``prepare``
tokenizes documents into shards the loader reads."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np
import pytest

from core.data.documents import open_documents
from core.data.errors import DataError
from core.data.prepare import prepare
from core.data.shards import ShardIndex
from core.data.tokenizer import (
    EOS_TOKENS,
    ByteTokenizer,
    HFTokenizer,
    check_vocab,
    train_bpe,
)

SENTENCE = "the model learns from text that volunteers never see experts wait on machines"
WORDS = (*SENTENCE.split(), "—", "ünïcode,", "数据", "😀", "tabs\tand", "new\nlines")


def corpus(documents: int = 60, seed: int = 0) -> list[str]:
    """A few KB of text with repeated words (something for BPE to merge)."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40))) for _ in range(documents)
    ]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    out = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    return train_bpe(corpus(), 400, out)


def test_a_trained_bpe_round_trips_any_text_and_names_its_end_of_text(
    trained: HFTokenizer,
) -> None:
    assert 300 < trained.vocab_size <= 400
    assert trained.eos_id == trained.tokenizer.token_to_id("<|endoftext|>")
    texts = [*corpus(5, seed=1), "never seen: ÆØÅ ⚙️ \x01 \r\n  two  spaces", ""]
    encoded = trained.encode_batch(texts)
    for text, ids in zip(texts, encoded, strict=True):
        assert trained.decode(ids) == text
        assert all(0 <= i < trained.vocab_size for i in ids)
        assert trained.eos_id not in ids  # documents get it from the shard writer only
    # merges learned: the data's common words cost fewer tokens than their bytes
    text = " ".join(WORDS)
    assert len(trained.encode_batch([text])[0]) < len(text.encode()) / 2


def test_a_tokenizer_is_pinned_by_the_sha256_of_its_file(trained: HFTokenizer) -> None:
    digest = hashlib.sha256(trained.path.read_bytes()).hexdigest()
    assert trained.sha256 == digest
    assert HFTokenizer.load(trained.path, pinned_sha256=digest).sha256 == digest
    assert HFTokenizer.load(trained.path, pinned_sha256=digest.upper()).sha256 == digest
    other = "ab" * 32
    with pytest.raises(DataError) as raised:
        HFTokenizer.load(trained.path, pinned_sha256=other)
    message = str(raised.value)
    assert str(trained.path) in message
    assert digest[:12] in message
    assert other[:12] in message


def test_the_models_vocabulary_must_hold_the_tokenizers(trained: HFTokenizer) -> None:
    check_vocab(trained, trained.vocab_size, "project.toml")
    check_vocab(trained, 1024, "project.toml")  # a larger one has unused rows: fine
    with pytest.raises(DataError, match=r"project.toml: vocab_size 300 is smaller than the"):
        check_vocab(trained, 300, "project.toml")
    with pytest.raises(DataError, match="vocab_size 256 is smaller than the tokenizer's 257"):
        check_vocab(ByteTokenizer(), 256, "manifest")


def test_a_tokenizer_without_an_end_of_text_token_is_refused(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    path = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]")).save(str(path))
    with pytest.raises(DataError) as raised:
        HFTokenizer.load(path)
    assert str(path) in str(raised.value)
    assert all(token in str(raised.value) for token in EOS_TOKENS)


@pytest.mark.parametrize("eos", ["</s>", "<|end_of_text|>", "<|im_end|>"])
def test_the_end_of_text_token_of_other_families_is_found(tmp_path: Path, eos: str) -> None:
    from tokenizers import Tokenizer, models

    path = tmp_path / "tokenizer.json"
    tokenizer = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tokenizer.add_special_tokens([eos])
    tokenizer.save(str(path))
    assert HFTokenizer.load(path).eos_id == 2


def test_a_file_that_is_no_tokenizer_is_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text('{"model": 3}')
    with pytest.raises(DataError, match=r"not a Hugging Face tokenizer\.json"):
        HFTokenizer.load(path)
    with pytest.raises(DataError, match="cannot read the tokenizer"):
        HFTokenizer.load(tmp_path / "missing.json")


def test_a_bpe_smaller_than_the_bytes_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="at least 257"):
        train_bpe(["text"], 256, tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


def test_bytes_need_no_file() -> None:
    tokenizer = ByteTokenizer()
    assert (tokenizer.vocab_size, tokenizer.eos_id, tokenizer.sha256) == (257, 256, "bytes")
    ids = tokenizer.encode_batch(["é😀", ""])
    assert ids == [list("é😀".encode()), []]
    assert tokenizer.decode(ids[0]) == "é😀"
    assert tokenizer.decode([*ids[0][:3], 256]) == "é\ufffd"  # a cut character, the eos


def test_prepare_writes_each_document_ended_by_the_end_of_text_id(
    tmp_path: Path, trained: HFTokenizer
) -> None:
    texts = corpus(40, seed=2)
    (tmp_path / "data").mkdir()
    for i, text in enumerate(texts):
        (tmp_path / "data" / f"{i:03d}.txt").write_text(text)
    source = open_documents(tmp_path / "data")
    seen: list[int] = []
    index = prepare(source, trained, tmp_path / "shards", on_progress=seen.append, shard_tokens=500)
    expected = [[*ids, trained.eos_id] for ids in trained.encode_batch(texts)]
    assert (index.documents, index.tokenizer, index.vocab_size) == (
        len(texts),
        trained.sha256,
        trained.vocab_size,
    )
    assert len(index.shards) > 1
    assert ShardIndex.read(tmp_path / "shards") == index
    tokens = np.concatenate([np.load(tmp_path / "shards" / f) for f, _ in index.shards]).tolist()
    assert tokens == [i for ids in expected for i in ids]
    assert seen == sorted(seen)
    assert seen[-1] == source.total_bytes


def test_prepare_with_bytes(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "hi"}\n{"text": "é"}\n')
    index = prepare(open_documents(tmp_path / "a.jsonl"), ByteTokenizer(), tmp_path / "s")
    assert np.load(tmp_path / "s" / index.shards[0][0]).tolist() == [
        *b"hi",
        256,
        *"é".encode(),
        256,
    ]
    assert (index.tokenizer, index.eos_id, index.vocab_size) == ("bytes", 256, 257)
