"""Token shards and the packed loader: documents packed with end-of-text ids, each
trainer its own share, held-out windows never trained on, weighted mixtures, a resumed
loader going on where it stopped, and one clear sentence for each kind of bad data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.data.errors import DataError
from core.data.loader import PackedLoader, SourceSpec
from core.data.shards import INDEX, ShardIndex, ShardWriter, open_shards

CONTEXT = 16
EOS = 0


def counting_shards(folder: Path, tokens: int, *, shard_tokens: int = 1000) -> Path:
    """Shards whose every token is its own position (+1; 0 is the end-of-text id): a
    window's first token names it."""
    writer = ShardWriter(
        folder, vocab_size=2**20, eos_id=EOS, tokenizer="t" * 64, shard_tokens=shard_tokens
    )
    writer.add(range(1, tokens))  # one long document: its EOS ends the last shard
    writer.close()
    return folder


def starts(loader: PackedLoader, batches: int) -> list[int]:
    out: list[int] = []
    for _ in range(batches):
        x, y = loader.next_batch()
        assert x.shape == y.shape == (loader.batch_size, CONTEXT)
        assert (x[:, 1:] == y[:, :-1]).all()  # targets are the next tokens
        out += x[:, 0].tolist()
    return out


def test_documents_are_packed_with_an_end_of_text_id_between_them(tmp_path):
    writer = ShardWriter(tmp_path / "s", vocab_size=300, eos_id=299, tokenizer="bytes")
    for text in ["hello", "", "world!"]:
        writer.add(text.encode())
    index = writer.close()
    assert (index.documents, index.tokens, index.dtype) == (2, 5 + 1 + 6 + 1, "uint16")
    files, read = open_shards(tmp_path / "s")
    assert read == index
    assert files[0].read(0, files[0].size).tolist() == [*b"hello", 299, *b"world!", 299]
    assert ShardIndex.read(tmp_path / "s").vocab_size == 300


def test_two_trainers_share_an_epoch_without_a_common_window_and_miss_none(tmp_path):
    source = SourceSpec(counting_shards(tmp_path / "s", 20_000))
    loaders = [
        PackedLoader([source], CONTEXT, batch_size=8, vocab_size=2**20, rank=r, world=2)
        for r in (0, 1)
    ]
    train = loaders[0].sources[0].train_windows
    per_trainer = train // 2
    seen = [starts(loader, per_trainer // 8) for loader in loaders]
    assert not set(seen[0]) & set(seen[1])
    assert len(set(seen[0])) == len(seen[0])  # no window twice within the epoch
    # a window starts at 1 + k*CONTEXT within its shard; held-out windows are the last ones
    held_out = {
        int(loaders[0].sources[0].window(k)[0][0])
        for k in range(train, train + loaders[0].sources[0].validation_windows)
    }
    assert not held_out & (set(seen[0]) | set(seen[1]))
    assert len(set(seen[0]) | set(seen[1])) == 2 * (per_trainer // 8) * 8


def test_held_out_windows_are_never_trained_on_over_many_epochs(tmp_path):
    loader = PackedLoader(
        [SourceSpec(counting_shards(tmp_path / "s", 3_000))], CONTEXT, 8, vocab_size=2**20
    )
    validation = {int(x[i, 0]) for x, _ in loader.validation_batches(2) for i in range(len(x))}
    trained = set(starts(loader, 5 * loader.sources[0].train_windows // 8))
    assert validation
    assert not validation & trained
    assert loader.state_dict()["sources"][0]["epoch"] >= 4
    # the same validation batches every time
    again = loader.validation_batches(2)
    assert all(
        (a[0] == b[0]).all() for a, b in zip(again, loader.validation_batches(2), strict=True)
    )


def test_a_resumed_loader_goes_on_with_the_next_batch(tmp_path):
    sources = [
        SourceSpec(counting_shards(tmp_path / "a", 5_000)),
        SourceSpec(counting_shards(tmp_path / "b", 9_000), weight=2.0),
    ]
    first = PackedLoader(sources, CONTEXT, 4, vocab_size=2**20, seed=7, rank=1, world=3)
    starts(first, 11)
    state = first.state_dict()
    expected = [first.next_batch()[0] for _ in range(6)]
    resumed = PackedLoader(sources, CONTEXT, 4, vocab_size=2**20, seed=7, rank=1, world=3)
    resumed.load_state_dict(state)
    assert all((resumed.next_batch()[0] == x).all() for x in expected)
    # the same loader started afresh gives other batches: the state is what resumed it
    fresh = PackedLoader(sources, CONTEXT, 4, vocab_size=2**20, seed=7, rank=1, world=3)
    assert not (fresh.next_batch()[0] == expected[0]).all()


def test_a_mixture_draws_rows_by_the_sources_weights(tmp_path):
    a = counting_shards(tmp_path / "a", 50_000)
    b_writer = ShardWriter(tmp_path / "b", vocab_size=2**20, eos_id=EOS, tokenizer="t" * 64)
    b_writer.add(range(2**19, 2**19 + 50_000))  # b's tokens are all >= 2**19
    b_writer.close()
    loader = PackedLoader(
        [SourceSpec(a, 3.0), SourceSpec(tmp_path / "b", 1.0)], CONTEXT, 100, vocab_size=2**20
    )
    rows = starts(loader, 40)
    from_b = sum(1 for t in rows if t >= 2**19) / len(rows)
    # 4,000 rows at p = 0.25: the standard deviation is 0.0068; the seed fixes the draw
    assert abs(from_b - 0.25) < 0.03
    validation = [x for x, _ in loader.validation_batches(4)]
    held = np.concatenate([x[:, 0].numpy() for x in validation])
    assert (held >= 2**19).sum() == 100  # a quarter of 400 rows


def test_foreign_token_files_are_read_as_they_are(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(1, 2_000, dtype=np.uint16))
    np.arange(1, 2_000, dtype=np.uint32).tofile(tmp_path / "b.bin")
    one = PackedLoader([SourceSpec(tmp_path / "a.npy")], CONTEXT, 2, vocab_size=4096)
    two = PackedLoader([SourceSpec(tmp_path / "b.bin", dtype="uint32")], CONTEXT, 2, 4096)
    assert (one.next_batch()[0] == two.next_batch()[0]).all()


@pytest.mark.parametrize(
    ("make", "loader_args", "message"),
    [
        (lambda p: np.save(p / "x.npy", np.arange(10, dtype=np.uint16)), {}, "fewer than two"),
        (
            lambda p: np.save(p / "x.npy", np.full(500, 5000, dtype=np.uint16)),
            {},
            "token id 5000 is outside the model's vocabulary of 4096",
        ),
        (lambda p: (p / "x.bin").write_bytes(b"\0" * 400), {}, "needs its dtype"),
        (lambda p: np.save(p / "x.npy", np.zeros(500, dtype=np.float32)), {}, "uint16 or uint32"),
        (lambda p: (p / "x.npy").write_bytes(b"not numpy"), {}, "not a token file"),
        (lambda p: (p / "notes.txt").write_text("hi"), {}, "no token files"),
        (
            lambda p: counting_shards(p, 3_000),
            {"tokenizer": "f" * 64},
            "tokenized with another tokenizer",
        ),
        (
            lambda p: counting_shards(p, 3_000),
            {"world": 500, "vocab_size": 2**20},
            "cannot be shared by 500",
        ),
        (
            lambda p: counting_shards(p, 3_000),
            {},
            "its tokens come from a vocabulary of 1048576, the model's has 4096",
        ),
        (lambda p: (p / INDEX).write_text("{"), {}, "unreadable shard index"),
    ],
)
def test_bad_data_gets_one_sentence_naming_the_file(tmp_path, make, loader_args, message):
    folder = tmp_path / "data"
    folder.mkdir()
    make(folder)
    args = {"vocab_size": 4096 if "tokenizer" not in loader_args else 2**20, **loader_args}
    if "world" in args:
        args["rank"] = 0
    with pytest.raises(DataError, match=message) as caught:
        PackedLoader([SourceSpec(folder)], CONTEXT, 2, **args).next_batch()
    assert str(folder) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_resuming_with_other_data_or_another_share_is_refused(tmp_path):
    a = SourceSpec(counting_shards(tmp_path / "a", 3_000))
    b = SourceSpec(counting_shards(tmp_path / "b", 3_000))
    state = PackedLoader([a], CONTEXT, 2, vocab_size=2**20).state_dict()
    with pytest.raises(DataError, match="resume with the same data"):
        PackedLoader([b], CONTEXT, 2, vocab_size=2**20).load_state_dict(state)
    with pytest.raises(DataError, match="trainer 0 of 1, this run 1 of 2"):
        PackedLoader([a], CONTEXT, 2, vocab_size=2**20, rank=1, world=2).load_state_dict(state)


def test_a_writer_refuses_a_folder_with_shards_and_ids_outside_its_vocabulary(tmp_path):
    counting_shards(tmp_path / "s", 100)
    with pytest.raises(DataError, match="already holds shards"):
        ShardWriter(tmp_path / "s", vocab_size=10, eos_id=0, tokenizer="bytes")
    writer = ShardWriter(tmp_path / "t", vocab_size=10, eos_id=0, tokenizer="bytes")
    with pytest.raises(DataError, match="token id 12 is outside the vocabulary of 10"):
        writer.add([3, 12])
    with pytest.raises(DataError, match="no document had any text"):
        ShardWriter(tmp_path / "u", vocab_size=10, eos_id=0, tokenizer="bytes").close()
