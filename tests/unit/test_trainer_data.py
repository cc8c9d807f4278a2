"""The byte-level training data: which files are read, in what order, within what budget,
how the text splits, and the batches drawn from it."""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from core.data.errors import DataError
from core.errors import UserFacingError
from core.trainer import data as data_module
from core.trainer.data import (
    DEFAULT_MAX_BYTES,
    STDLIB,
    Corpus,
    load_corpus,
    sample_batch,
    stdlib_sources,
    text_files,
    validation_batches,
)


def _expected_bytes(files: list[Path], budget: int) -> bytes:
    """What load_corpus should read: each file and a newline, cut at the budget."""
    out = bytearray()
    for path in files:
        out += path.read_bytes() + b"\n"
        if len(out) >= budget:
            break
    return bytes(out[:budget])


def _joined(corpus: Corpus) -> bytes:
    return bytes(torch.cat([corpus.train, corpus.validation]).tolist())


# --- the standard library corpus ----------------------------------------------------------


def test_stdlib_sources_are_the_standard_library_py_files_in_order():
    sources = stdlib_sources()
    root = Path(sysconfig.get_paths()["stdlib"])
    assert len(sources) > 100
    assert sources == sorted(sources)
    for path in sources:
        assert path.suffix == ".py"
        assert path.is_relative_to(root)
        assert not {"site-packages", "dist-packages", "__pycache__"} & set(path.parts)
    assert root / "os.py" in sources


def test_stdlib_corpus_is_bounded_and_split_at_the_end():
    corpus = load_corpus(STDLIB, max_bytes=200_000)
    assert corpus.source == STDLIB
    assert corpus.total_bytes == 200_000
    assert corpus.files > 1
    for part in (corpus.train, corpus.validation):
        assert part.dtype == torch.uint8
        assert part.dim() == 1
    # 5 % of the text, held out from its end: train and validation are consecutive.
    assert corpus.validation.numel() == 10_000
    assert corpus.train.numel() == 190_000
    assert _joined(corpus) == _expected_bytes(stdlib_sources(), 200_000)
    # Each split owns its memory (not a view of one shared buffer).
    assert corpus.train.data_ptr() != corpus.validation.data_ptr()
    corpus.train[0] = 0  # writable


def test_default_budget_is_32_mib():
    assert DEFAULT_MAX_BYTES == 32 * 1024 * 1024


def test_missing_stdlib_sources_say_to_use_a_folder(tmp_path, monkeypatch):
    # A frozen (PyInstaller) build has no .py sources where sysconfig points.
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path / "none")})
    assert stdlib_sources() == []
    with pytest.raises(DataError, match="point --data at a folder of text files"):
        load_corpus(STDLIB)


# --- folders of text files ----------------------------------------------------------------


def _write(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


@pytest.fixture
def folder(tmp_path) -> Path:
    root = tmp_path / "texts"
    _write(root / "b.txt", b"second file " * 300)
    _write(root / "a" / "z.md", "# notes \u00e9t\u00e9\n".encode() * 200)
    _write(root / "a" / "sub" / "c.txt", b"first file " * 300)
    _write(root / "image.bin", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 100)
    _write(root / ".hidden.txt", b"hidden " * 1000)
    _write(root / ".git" / "config", b"[core]\n" * 1000)
    _write(root / "empty.txt", b"")
    return root


def test_text_files_are_sorted_and_skip_binary_hidden_and_empty(folder, caplog):
    caplog.set_level(logging.WARNING, logger="core.trainer.data")
    assert text_files(folder) == [
        folder / "a" / "sub" / "c.txt",
        folder / "a" / "z.md",
        folder / "b.txt",
    ]
    # the binary and the empty file are said to be skipped, with one of them named
    (line,) = [r.getMessage() for r in caplog.records]
    assert "skipping 2 of 5 files" in line
    assert "empty.txt" in line


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks need privileges on Windows")
def test_text_files_skip_symlinks(folder, tmp_path):
    outside = _write(tmp_path / "outside" / "secret.txt", b"outside " * 100)
    os.symlink(outside, folder / "link.txt")
    os.symlink(outside.parent, folder / "linked_dir")
    assert folder / "link.txt" not in text_files(folder)
    assert all("linked_dir" not in path.parts for path in text_files(folder))


_ASCII_TO_BOUNDARY = b"x" * (8 * 1024 - 1)


@pytest.mark.parametrize(
    ("content", "is_text"),
    [
        pytest.param(b"plain ascii\n", True, id="ascii"),
        pytest.param("caf\u00e9 \u65e5\u672c\n".encode(), True, id="utf8"),
        pytest.param(b"caf\xe9\n", False, id="latin1"),
        pytest.param(b"text\x00more", False, id="nul"),
        pytest.param(b"x" * 9000 + b"\x00", True, id="nul-after-8kib"),
        # "é" (2 bytes) cut by the 8 KiB boundary of a longer file: still text.
        pytest.param(_ASCII_TO_BOUNDARY + "\u00e9".encode() + b"tail", True, id="cut-char"),
        # The same cut at the real end of a file is broken UTF-8.
        pytest.param(b"short" + "\u00e9".encode()[:1], False, id="truncated-end"),
        pytest.param(b"", False, id="empty"),
    ],
)
def test_what_looks_like_text(tmp_path, content, is_text):
    path = _write(tmp_path / "d" / "f.txt", content)
    assert text_files(tmp_path / "d") == ([path] if is_text else [])


def test_folder_corpus_reads_text_files_in_order(folder):
    corpus = load_corpus(folder, min_bytes=1000)
    assert corpus.source == str(folder)
    assert corpus.files == 3
    assert _joined(corpus) == _expected_bytes(text_files(folder), DEFAULT_MAX_BYTES)
    assert _joined(corpus).startswith(b"first file ")
    # Under the 1 KiB floor, 5 % would be too little to evaluate on.
    assert corpus.validation.numel() == 1024


def test_folder_given_as_string(folder):
    assert load_corpus(str(folder), min_bytes=1000).files == 3


def test_single_file(tmp_path):
    path = _write(tmp_path / "book.txt", b"once upon a time " * 1000)
    corpus = load_corpus(path)
    assert corpus.files == 1
    assert corpus.source == str(path)
    assert _joined(corpus) == path.read_bytes() + b"\n"


def test_huge_file_is_read_only_up_to_the_budget(tmp_path, monkeypatch):
    path = _write(tmp_path / "big" / "huge.txt", b"0123456789abcdef" * (3 * 1024 * 1024 // 16))
    read_sizes: list[int] = []
    original = data_module._read_prefix

    def spy(p, budget, into):
        read_sizes.append(budget)
        original(p, budget, into)

    monkeypatch.setattr(data_module, "_read_prefix", spy)
    corpus = load_corpus(path.parent, max_bytes=100_000)
    assert corpus.total_bytes == 100_000
    assert read_sizes == [100_000]
    assert _joined(corpus) == path.read_bytes()[:100_000]


def test_file_exactly_at_the_budget_gets_no_separator(tmp_path):
    path = _write(tmp_path / "d" / "f.txt", b"a" * 5000)
    corpus = load_corpus(path.parent, max_bytes=5000)
    assert _joined(corpus) == b"a" * 5000


def test_unreadable_file_is_skipped(tmp_path, monkeypatch):
    good = _write(tmp_path / "d" / "good.txt", b"good " * 2000)
    vanished = tmp_path / "d" / "vanished.txt"  # listed, then gone before reading
    monkeypatch.setattr(data_module, "text_files", lambda _folder: [vanished, good])
    corpus = load_corpus(tmp_path / "d")
    assert corpus.files == 1
    assert _joined(corpus) == good.read_bytes() + b"\n"


# --- errors -------------------------------------------------------------------------------


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "nowhere"


def _empty(tmp_path: Path) -> Path:
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def _binary_only(tmp_path: Path) -> Path:
    _write(tmp_path / "bin" / "a.dat", b"\x00\x01\x02" * 1000)
    _write(tmp_path / "bin" / "b.dat", bytes(range(256)) * 10)
    return tmp_path / "bin"


def _binary_file(tmp_path: Path) -> Path:
    return _write(tmp_path / "one.bin", b"\x00" * 5000)


def _too_little(tmp_path: Path) -> Path:
    _write(tmp_path / "small" / "a.txt", b"tiny " * 100)  # 500 bytes + newline
    return tmp_path / "small"


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (_missing, r"nowhere does not exist: point --data at a folder"),
        (_empty, r"no text files in .*empty"),
        (_binary_only, r"no text files in .*bin"),
        (_binary_file, r"one\.bin does not look like text"),
        (_too_little, r"needs at least 4096 bytes of text, found 501"),
    ],
)
def test_unusable_sources(tmp_path, make, match):
    with pytest.raises(DataError, match=match):
        load_corpus(make(tmp_path))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"validation_fraction": 0.0}, "validation fraction must be between 0 and 0.5"),
        ({"validation_fraction": 0.5}, "validation fraction must be between 0 and 0.5"),
        ({"validation_fraction": -0.1}, "validation fraction must be between 0 and 0.5"),
        ({"validation_fraction": 1.5}, "validation fraction must be between 0 and 0.5"),
        ({"max_bytes": 1000}, r"budget \(1000 bytes\) is below the 4096 bytes"),
        ({"min_bytes": 1}, "at least 2 bytes"),
    ],
)
def test_bad_arguments(folder, kwargs, match):
    with pytest.raises(DataError, match=match):
        load_corpus(folder, **kwargs)


def test_data_error_is_for_the_person_at_the_keyboard():
    assert issubclass(DataError, UserFacingError)


# --- batches ------------------------------------------------------------------------------

_RAMP = torch.arange(256, dtype=torch.uint8).repeat(8)  # every byte one more than the last


def _assert_windows_of_ramp(x: torch.Tensor, y: torch.Tensor) -> None:
    """Windows of _RAMP: consecutive values (mod 256), targets one step ahead."""
    assert torch.equal((x[:, 1:] - x[:, :-1]) % 256, torch.ones_like(x[:, 1:]))
    assert torch.equal(y, (x + 1) % 256)
    assert torch.equal(y[:, :-1], x[:, 1:])


def test_sample_batch_shapes_and_targets():
    x, y = sample_batch(_RAMP, 6, 17, torch.Generator().manual_seed(0))
    for t in (x, y):
        assert t.shape == (6, 17)
        assert t.dtype == torch.int64
        assert t.is_contiguous()
        assert int(t.min()) >= 0
        assert int(t.max()) <= 255
    _assert_windows_of_ramp(x, y)


def test_sample_batch_uses_the_whole_range():
    data = torch.arange(64, dtype=torch.uint8)
    x, y = sample_batch(data, 2000, 8, torch.Generator().manual_seed(1))
    assert set(x[:, 0].tolist()) == set(range(64 - 8))  # every start, the last included
    assert int(y.max()) == 63


def test_sample_batch_is_reproducible_from_the_seed():
    first = sample_batch(_RAMP, 4, 32, torch.Generator().manual_seed(7))
    again = sample_batch(_RAMP, 4, 32, torch.Generator().manual_seed(7))
    other = sample_batch(_RAMP, 4, 32, torch.Generator().manual_seed(8))
    assert torch.equal(first[0], again[0])
    assert torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])


def test_sample_batch_of_data_exactly_one_window_long():
    data = torch.arange(9, dtype=torch.uint8)
    x, y = sample_batch(data, 3, 8, torch.Generator().manual_seed(0))
    assert torch.equal(x, torch.arange(8).repeat(3, 1))
    assert torch.equal(y, torch.arange(1, 9).repeat(3, 1))


def test_validation_batches_are_deterministic_and_cover_the_data():
    batches = validation_batches(_RAMP, 4, 16, 3)
    assert len(batches) == 3
    again = validation_batches(_RAMP, 4, 16, 3)
    for (x, y), (x2, y2) in zip(batches, again, strict=True):
        assert x.shape == y.shape == (4, 16)
        assert x.dtype == y.dtype == torch.int64
        assert torch.equal(x, x2)
        assert torch.equal(y, y2)
        _assert_windows_of_ramp(x, y)
    starts = torch.cat([x[:, 0] for x, _ in batches])
    # Evenly spaced from the first byte to the last full window.
    assert starts[0] == 0
    last = torch.cat([y[:, -1] for _, y in batches])[-1]
    assert int(last) == int(_RAMP[-1])


def test_validation_batch_offsets_are_evenly_spaced():
    data = torch.arange(101, dtype=torch.uint8)
    (x, _y), (x2, _y2) = validation_batches(data, 3, 10, 2)
    assert torch.cat([x[:, 0], x2[:, 0]]).tolist() == [0, 18, 36, 54, 72, 90]


@pytest.mark.parametrize(
    ("length", "batch_size", "context", "count"),
    [
        (16, 2, 16, 1),  # data shorter than context + 1
        (0, 1, 1, 1),
        (64, 0, 8, 1),
        (64, 2, 0, 1),
        (64, 2, 8, 0),
    ],
)
def test_impossible_batches(length, batch_size, context, count):
    data = torch.zeros(length, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"at least|too few"):
        validation_batches(data, batch_size, context, count)
    if count >= 1:
        with pytest.raises(ValueError, match=r"at least|too few"):
            sample_batch(data, batch_size, context, torch.Generator().manual_seed(0))


def test_batches_need_one_dimensional_data():
    with pytest.raises(ValueError, match="1-D"):
        sample_batch(torch.zeros(4, 64, dtype=torch.uint8), 1, 8, torch.Generator())
