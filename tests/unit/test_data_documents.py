"""Documents from the owner's data: each format streams the documents it holds, naming
where each came from; the format is guessed from the path; and every kind of bad input
stops with one sentence naming the file and, where there is one, the row."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core.data import documents
from core.data.documents import Document, guess_format, open_documents
from core.data.errors import DataError


def jsonl(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def parquet(path: Path, columns: dict[str, list[Any]], row_group_size: int = 2) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def dataset(path: Path, columns: dict[str, list[Any]], features: Any = None) -> Path:
    import datasets

    datasets.Dataset.from_dict(columns, features=features).save_to_disk(str(path))
    return path


def read_all(path: Path, fmt: str | None) -> None:
    """What the CLI does: open, ask the size for the bar, read every document."""
    source = open_documents(path, fmt)
    assert (source.total_bytes or 0) >= 0
    for _ in source:
        pass


def read(path: Path, fmt: str | None = None, field: str = "text") -> list[Document]:
    return list(open_documents(path, fmt, field))


# ---------------------------------------------------------------- each format streams


def test_a_text_folder_gives_each_file_a_document_and_skips_hidden_ones(tmp_path: Path) -> None:
    (tmp_path / "books" / "deep").mkdir(parents=True)
    (tmp_path / "books" / "a.txt").write_text("first book\n")
    (tmp_path / "books" / "deep" / "b.md").write_text("second — ünïcode\n")
    (tmp_path / "books" / ".hidden").write_bytes(b"\0 never read")
    (tmp_path / "books" / ".git").mkdir()
    (tmp_path / "books" / ".git" / "index").write_bytes(b"\0\1\2")
    source = open_documents(tmp_path / "books")
    assert read(tmp_path / "books") == [
        Document(str(tmp_path / "books" / "a.txt"), "first book\n"),
        Document(str(tmp_path / "books" / "deep" / "b.md"), "second — ünïcode\n"),
    ]
    assert source.total_bytes == len("first book\n") + len("second — ünïcode\n".encode())
    assert "2 files" in source.describe()


def test_a_large_text_file_is_cut_at_line_ends_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(documents, "TEXT_PIECE", 64)
    monkeypatch.setattr(documents, "_TEXT_PIECE_MAX", 256)
    # multibyte characters land on piece boundaries; one line is longer than the cap
    text = "".join(f"line {i} ünï €😀\n" for i in range(40)) + "x" * 600 + "\nend"
    path = tmp_path / "big.txt"
    path.write_text(text)
    pieces = read(path)
    assert "".join(d.text for d in pieces) == text
    assert len(pieces) > 5
    start = 0
    for piece in pieces:
        # cut at a line end, unless the line outgrew the cap (or the file ended)
        assert piece.text.endswith("\n") or len(piece.text) >= 256 or piece is pieces[-1]
        assert piece.where == f"{path}:{1 + text.count(chr(10), 0, start)}"  # its first line
        start += len(piece.text)


def test_jsonl_files_and_folders_stream_their_field_line_by_line(tmp_path: Path) -> None:
    a = jsonl(tmp_path / "data" / "a.jsonl", [{"text": "one", "id": 1}, {"text": "two"}])
    (tmp_path / "data" / "b.jsonl.gz").write_bytes(
        gzip.compress(b'{"body": "x", "text": "three"}\n\n{"text": ""}\n')
    )
    (tmp_path / "data" / "README.md").write_text("a dataset card, not data")
    docs = read(tmp_path / "data")
    b = tmp_path / "data" / "b.jsonl.gz"
    assert docs == [
        Document(f"{a}:1", "one"),
        Document(f"{a}:2", "two"),
        Document(f"{b}:1", "three"),
        Document(f"{b}:3", ""),  # blank line 2 skipped
    ]
    assert open_documents(tmp_path / "data").total_bytes is None  # compressed: unknown
    assert next(iter(open_documents(b, field="body"))) == Document(f"{b}:1", "x")


def test_parquet_files_stream_their_column_in_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(documents, "ROW_BATCH", 2)
    x = parquet(tmp_path / "p" / "x.parquet", {"text": ["a", "bb", "ccc"], "n": [1, 2, 3]})
    y = parquet(tmp_path / "p" / "y.parquet", {"text": ["dddd"], "n": [4]})
    source = open_documents(tmp_path / "p")
    assert list(source) == [
        Document(f"{x} row 0", "a"),
        Document(f"{x} row 1", "bb"),
        Document(f"{x} row 2", "ccc"),
        Document(f"{y} row 0", "dddd"),
    ]
    assert (source.total_bytes or 0) >= 10


def test_a_saved_dataset_streams_its_column_and_a_dict_its_train_split(tmp_path: Path) -> None:
    import datasets

    path = dataset(tmp_path / "ds", {"text": ["a", "b", "c"], "label": [0, 1, 0]})
    source = open_documents(path)
    assert list(source) == [Document(f"{path} row {i}", t) for i, t in enumerate("abc")]
    assert (source.total_bytes or 0) >= 3
    splits = datasets.DatasetDict(
        {
            "test": datasets.Dataset.from_dict({"text": ["held out"]}),
            "train": datasets.Dataset.from_dict({"text": ["learned"]}),
        }
    )
    splits.save_to_disk(str(tmp_path / "dict"))
    assert [d.text for d in read(tmp_path / "dict")] == ["learned"]
    assert str(tmp_path / "dict" / "train") in open_documents(tmp_path / "dict").describe()


# ---------------------------------------------------------------- the guess


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ({"a.txt": "x"}, "text"),
        ({"a.jsonl": "{}"}, "jsonl"),
        ({"a.jsonl.gz": ""}, "jsonl"),
        ({"sub/a.jsonl": "{}", "README.md": "card"}, "jsonl"),
        ({"a.parquet": "", "LICENSE": "text"}, "parquet"),
        ({"state.json": "{}", "data-00000-of-00001.arrow": ""}, "dataset"),
        ({"dataset_info.json": "{}"}, "dataset"),
        ({"dataset_dict.json": "{}"}, "dataset"),
        ({"notes.json": "{}"}, "text"),
    ],
)
def test_the_format_is_guessed_from_the_folder(
    tmp_path: Path, layout: dict[str, str], expected: str
) -> None:
    for name, content in layout.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    assert guess_format(tmp_path) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [("a.txt", "text"), ("a.jsonl", "jsonl"), ("a.jsonl.gz", "jsonl"), ("a.parquet", "parquet")],
)
def test_the_format_of_a_file_is_its_name(tmp_path: Path, name: str, expected: str) -> None:
    (tmp_path / name).write_text("")
    assert guess_format(tmp_path / name) == expected


def test_a_folder_of_both_jsonl_and_parquet_asks_for_a_format(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("{}")
    (tmp_path / "b.parquet").write_text("")
    with pytest.raises(DataError, match="--format"):
        open_documents(tmp_path)


# ---------------------------------------------------------------- bad input


def binary_in_text_folder(tmp: Path) -> tuple[Path, str | None, list[str]]:
    (tmp / "d").mkdir()
    (tmp / "d" / "a.txt").write_text("fine")
    (tmp / "d" / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    return tmp / "d", None, [f"{tmp / 'd' / 'b.png'}:", "binary", "byte 8"]


def not_utf8(tmp: Path) -> tuple[Path, str | None, list[str]]:
    (tmp / "a.txt").write_bytes("héllo ".encode() + b"\xff world")
    return tmp / "a.txt", None, [f"{tmp / 'a.txt'}:", "not UTF-8", "byte 7"]


def not_utf8_far_in(tmp: Path) -> tuple[Path, str | None, list[str]]:
    # past the first piece read, which ends inside a "€" (3 bytes): the offset still counts
    (tmp / "a.txt").write_bytes("€".encode() * 1_400_000 + b"\xc3(")
    return tmp / "a.txt", None, [f"{tmp / 'a.txt'}:", "byte 4200000"]


def bad_json(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = tmp / "a.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "cut\n')
    return path, None, [f"{path}:2:", "not valid JSON (Invalid control character at column 14)"]


def json_list(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = jsonl(tmp / "a.jsonl", [["text", "x"]])
    return path, None, [f"{path}:1:", "an array, not a JSON object"]


def jsonl_not_utf8(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = tmp / "a.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    return path, None, [f"{path}:2:", "not UTF-8", "byte 25"]


def jsonl_binary(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = tmp / "a.jsonl"
    path.write_bytes(b'{"text": "ok"}\n\0\0\0\n')
    return path, None, [f"{path}:2:", "binary"]


def missing_field(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = jsonl(tmp / "a.jsonl", [{"text": "a"}, {"text": "b"}, {"body": "c", "id": 3}])
    return path, None, [f"{path}:3:", "'text'", "'body', 'id'", "--field"]


def not_a_string(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = jsonl(tmp / "a.jsonl", [{"text": 5}])
    return path, None, [f"{path}:1:", "holds a number, not text"]


def null_field(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = jsonl(tmp / "a.jsonl", [{"text": "a"}, {"text": None}])
    return path, None, [f"{path}:2:", "null"]


def broken_gzip(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = tmp / "a.jsonl.gz"
    path.write_bytes(b"not gzip at all")
    return path, None, [f"{path}:", "cannot be read"]


def empty_jsonl(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = tmp / "a.jsonl"
    path.write_text("\n\n")
    return path, None, [f"{path}:", "no document"]


def empty_texts(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = jsonl(tmp / "a.jsonl", [{"text": ""}])
    return path, None, [f"{path}:", "no document"]


def empty_text_folder(tmp: Path) -> tuple[Path, str | None, list[str]]:
    (tmp / "d").mkdir()
    return tmp / "d", None, [f"{tmp / 'd'}:", "no files"]


def no_jsonl_in_folder(tmp: Path) -> tuple[Path, str | None, list[str]]:
    (tmp / "d").mkdir()
    (tmp / "d" / "a.txt").write_text("x")
    return tmp / "d", "jsonl", [f"{tmp / 'd'}:", ".jsonl"]


def missing_column(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = parquet(tmp / "x.parquet", {"body": ["a"], "n": [1]})
    return path, None, [f"{path}:", "'text'", "'body', 'n'", "--field"]


def null_row(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = parquet(tmp / "x.parquet", {"text": ["a", "b", None, "d"]})
    return path, None, [f"{path} row 2:", "null"]


def numbers_column(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = parquet(tmp / "x.parquet", {"text": [1, 2]})
    return path, None, [f"{path}:", "int64", "not text"]


def not_parquet(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = tmp / "x.parquet"
    path.write_text("a,b\n1,2\n")
    return path, None, [f"{path}:", "not a Parquet file"]


def empty_parquet(tmp: Path) -> tuple[Path, str | None, list[str]]:
    import pyarrow as pa

    path = parquet(tmp / "x.parquet", {"text": pa.array([], pa.string())})
    return path, None, [f"{path}:", "no document"]


def dataset_missing_column(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = dataset(tmp / "ds", {"content": ["a"]})
    return path, None, [f"{path}:", "'text'", "'content'"]


def dataset_null(tmp: Path) -> tuple[Path, str | None, list[str]]:
    path = dataset(tmp / "ds", {"text": ["a", None]})
    return path, None, [f"{path} row 1:", "null"]


def empty_dataset(tmp: Path) -> tuple[Path, str | None, list[str]]:
    import datasets

    features = datasets.Features({"text": datasets.Value("string")})
    path = dataset(tmp / "ds", {"text": []}, features)
    return path, None, [f"{path}:", "no document"]


def not_a_dataset(tmp: Path) -> tuple[Path, str | None, list[str]]:
    (tmp / "ds").mkdir()
    (tmp / "ds" / "a.txt").write_text("x")
    return tmp / "ds", "dataset", [f"{tmp / 'ds'}:", "not a dataset"]


def missing_path(tmp: Path) -> tuple[Path, str | None, list[str]]:
    return tmp / "nowhere", None, [f"{tmp / 'nowhere'} does not exist"]


def unknown_format(tmp: Path) -> tuple[Path, str | None, list[str]]:
    (tmp / "a.txt").write_text("x")
    return tmp / "a.txt", "csv", ["'csv'", "text, jsonl, parquet, dataset"]


BAD: list[Callable[[Path], tuple[Path, str | None, list[str]]]] = [
    binary_in_text_folder,
    not_utf8,
    not_utf8_far_in,
    bad_json,
    json_list,
    jsonl_not_utf8,
    jsonl_binary,
    missing_field,
    not_a_string,
    null_field,
    broken_gzip,
    empty_jsonl,
    empty_texts,
    empty_text_folder,
    no_jsonl_in_folder,
    missing_column,
    null_row,
    numbers_column,
    not_parquet,
    empty_parquet,
    dataset_missing_column,
    dataset_null,
    empty_dataset,
    not_a_dataset,
    missing_path,
    unknown_format,
]


@pytest.mark.parametrize("case", BAD, ids=[case.__name__ for case in BAD])
def test_bad_input_is_one_sentence_naming_the_file_and_row(
    tmp_path: Path,
    case: Callable[[Path], tuple[Path, str | None, list[str]]],
) -> None:
    path, fmt, said = case(tmp_path)
    with pytest.raises(DataError) as raised:
        read_all(path, fmt)
    message = str(raised.value)
    assert "\n" not in message
    for part in said:
        assert part in message, (part, message)
