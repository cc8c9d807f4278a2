"""Documents from the owner's data, streamed: folders of text, JSON lines (a named field),
Parquet (a named column) and datasets saved with ``datasets`` (``save_to_disk``).

Every source yields :class:`Document` s one after the other and never holds more than a
batch of rows (or a piece of a text file) in memory, so data of any size goes through.
Each document says where it came from ("data/a.jsonl:17", "x.parquet row 1203"), and bad
input stops with one :class:`DataError` sentence naming the file and the row.

Rows of Parquet files and datasets are counted from 0 (as pandas and ``datasets`` show
them); lines of JSON-lines files and text files from 1 (as editors show them).

pyarrow and datasets are imported only by the sources that read them: they are the
owner's extras, and ``datasets`` alone takes seconds to import.
"""

from __future__ import annotations

import codecs
import gzip
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Final

from core.data.errors import DataError

log = logging.getLogger(__name__)

FORMATS: Final = ("text", "jsonl", "parquet", "dataset")
#: Files that mark a folder written by ``datasets``' ``save_to_disk``.
DATASET_MARKERS: Final = ("dataset_info.json", "state.json", "dataset_dict.json")
#: Rows read at once from Parquet and datasets: bounded memory, few Python round trips.
ROW_BATCH: Final = 1024
#: Text files are read in pieces of this size. A file larger than one piece becomes
#: several documents, cut at line ends, so that one huge file cannot fill the memory.
TEXT_PIECE: Final = 4 * 1024 * 1024
#: A piece that holds no line end is cut anyway once it grows past this.
_TEXT_PIECE_MAX: Final = 4 * TEXT_PIECE


@dataclass(frozen=True)
class Document:
    """One document's text, and where it came from (file, and row where there is one)."""

    where: str
    text: str


def _missing_extra(package: str) -> DataError:
    return DataError(f"reading this data needs the {package} package: pip install 'moehome[owner]'")


def _walk(folder: Path) -> list[Path]:
    """Regular files under ``folder``, recursive and sorted; hidden files and folders (.git,
    .DS_Store) and symbolic links are skipped, as ``core.trainer.data.text_files`` does:
    links could lead outside the folder or read a file twice."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [
            d for d in dirnames if not d.startswith(".") and not Path(dirpath, d).is_symlink()
        ]
        for name in filenames:
            path = Path(dirpath, name)
            if not name.startswith(".") and not path.is_symlink() and path.is_file():
                found.append(path)
    return sorted(found)


def _is_jsonl(path: Path) -> bool:
    return path.name.endswith((".jsonl", ".jsonl.gz"))


def _is_parquet(path: Path) -> bool:
    return path.suffix == ".parquet"


class DocumentSource:
    """Documents of one path. Iterating reads them anew each time (a tokenizer is trained
    on one pass, shards are made on another)."""

    kind: str = "data"

    def __init__(self, path: Path) -> None:
        self.path = path

    def _documents(self) -> Iterator[Document]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Document]:
        with_text = 0
        for document in self._documents():
            with_text += bool(document.text)
            yield document
        if not with_text:
            raise DataError(f"{self.path}: no document with any text in it; nothing to train on")

    @property
    def total_bytes(self) -> int | None:
        """About how many bytes of text the documents hold (for a progress bar), or None
        when that cannot be known without reading everything."""
        return None

    def describe(self) -> str:
        return f"{self.kind} {self.path}"


def _files(path: Path, wanted: str, matches: Callable[[Path], bool]) -> list[Path]:
    """``path`` itself, or the files of the folder ``path`` that ``matches``."""
    if path.is_file():
        return [path]
    files = [p for p in _walk(path) if matches(p)]
    if not files:
        raise DataError(f"{path}: no {wanted} files in this folder")
    return files


def _count(files: list[Path]) -> str:
    return f"{len(files)} file" if len(files) == 1 else f"{len(files)} files"


def _sizes(files: list[Path]) -> int:
    return sum(p.stat().st_size for p in files)


class TextFiles(DocumentSource):
    """A text file, or every file of a folder: each file a document (a file larger than
    :data:`TEXT_PIECE` several, cut at line ends). A file that is not UTF-8 text stops the
    run: skipping it would silently train on less than the owner meant."""

    kind = "text"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        if path.is_file():
            self.files = [path]
        else:
            self.files = _walk(path)
            if not self.files:
                raise DataError(f"{path}: no files in this folder (hidden files are skipped)")

    @cached_property
    def _total(self) -> int:
        return _sizes(self.files)

    @property
    def total_bytes(self) -> int | None:
        return self._total  # UTF-8 text is as long as its file

    def describe(self) -> str:
        return f"text {self.path} ({_count(self.files)})"

    def _documents(self) -> Iterator[Document]:
        for path in self.files:
            yield from self._pieces(path)

    def _pieces(self, path: Path) -> Iterator[Document]:
        decoder = codecs.getincrementaldecoder("utf-8")()
        whole = path.stat().st_size <= TEXT_PIECE
        offset, line, pending = 0, 1, ""
        try:
            with path.open("rb") as f:
                while True:
                    chunk = f.read(TEXT_PIECE)
                    end = len(chunk) < TEXT_PIECE
                    nul = chunk.find(b"\0")
                    if nul >= 0:
                        raise DataError(
                            f"{path}: a binary file (a NUL byte at byte {offset + nul}), not "
                            "text; remove it from the folder or convert it to UTF-8 text"
                        )
                    buffered = len(decoder.getstate()[0])
                    try:
                        text = pending + decoder.decode(chunk, final=end)
                    except UnicodeDecodeError as exc:
                        at = offset - buffered + exc.start
                        raise DataError(
                            f"{path}: not UTF-8 text (byte {at}); convert it to UTF-8"
                        ) from None
                    offset += len(chunk)
                    if whole:
                        if end:
                            yield Document(str(path), text)
                            return
                        pending = text  # the file grew while it was read
                        continue
                    cut = len(text) if end else text.rfind("\n") + 1
                    if not cut and len(text) >= _TEXT_PIECE_MAX:
                        cut = len(text)  # one line of many megabytes: cut it anyway
                    if cut:
                        yield Document(f"{path}:{line}", text[:cut])
                        line += text.count("\n", 0, cut)
                    pending = text[cut:]
                    if end:
                        return
        except OSError as exc:
            raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from None


class JsonLines(DocumentSource):
    """``.jsonl`` (or ``.jsonl.gz``) files: one JSON object a line, its text in ``field``;
    read line by line. Blank lines are skipped."""

    kind = "jsonl"

    def __init__(self, path: Path, field: str) -> None:
        super().__init__(path)
        self.field = field
        self.files = _files(path, ".jsonl", _is_jsonl)

    @cached_property
    def _total(self) -> int | None:
        if any(p.name.endswith(".gz") for p in self.files):
            return None  # a compressed size says little about the text inside
        # JSON quoting and the other fields make the files a bit larger than the text.
        return _sizes(self.files)

    @property
    def total_bytes(self) -> int | None:
        return self._total

    def describe(self) -> str:
        return f"jsonl {self.path} ({_count(self.files)}, field {self.field!r})"

    def _documents(self) -> Iterator[Document]:
        for path in self.files:
            yield from self._lines(path)

    def _lines(self, path: Path) -> Iterator[Document]:
        offset = 0
        try:
            gz = path.name.endswith(".gz")
            with gzip.open(path, "rb") if gz else path.open("rb") as f:
                for number, raw in enumerate(f, start=1):
                    where = f"{path}:{number}"
                    yield from self._row(where, raw, offset)
                    offset += len(raw)
        except (OSError, EOFError) as exc:
            # gzip says BadGzipFile (an OSError) or EOFError for a damaged file
            raise DataError(f"{path}: cannot be read ({exc})") from None

    def _row(self, where: str, raw: bytes, offset: int) -> Iterator[Document]:
        if b"\0" in raw:
            raise DataError(f"{where}: binary data (a NUL byte), not a line of JSON")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{where}: not UTF-8 (byte {offset + exc.start} of the file)") from None
        if not line.strip():
            return
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            said = exc.msg.removesuffix(" at")  # "Invalid control character at"
            raise DataError(f"{where}: not valid JSON ({said} at column {exc.colno})") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: {_json_kind(row)}, not a JSON object with fields")
        yield Document(where, _text(where, row, self.field, "field"))


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise _missing_extra("pyarrow") from None
    return pyarrow


def _json_kind(value: object) -> str:
    """What JSON calls the kind of ``value``, with its article."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "an array" if isinstance(value, list) else "an object"


def _text(where: str, row: dict[str, Any], field: str, what: str) -> str:
    """``row[field]`` when it is a string; else the sentence that says what is wrong."""
    if field not in row:
        present = ", ".join(repr(k) for k in row) or "none"
        raise DataError(
            f"{where}: no {what} {field!r} (the {what}s are {present}); choose one with --field"
        )
    value = row[field]
    if value is None:
        raise DataError(f"{where}: {what} {field!r} is null, not text")
    if not isinstance(value, str):
        raise DataError(f"{where}: {what} {field!r} holds {_json_kind(value)}, not text")
    return value


class ParquetFiles(DocumentSource):
    """``.parquet`` files, their text in the column ``field``; read a batch of rows of that
    column at a time."""

    kind = "parquet"

    def __init__(self, path: Path, field: str) -> None:
        super().__init__(path)
        self.field = field
        self.files = _files(path, ".parquet", _is_parquet)

    def _open(self, path: Path) -> Any:
        pa = _pyarrow()
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{path}: not a Parquet file ({exc})") from None
        schema = parquet.schema_arrow
        names = schema.names
        if self.field not in names:
            present = ", ".join(repr(n) for n in names) or "none"
            raise DataError(
                f"{path}: no column {self.field!r} (the columns are {present}); choose one "
                "with --field"
            )
        kind = schema.field(self.field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            # (string views, pyarrow's third kind of text column, are rare in files)
            raise DataError(f"{path}: column {self.field!r} holds {kind}, not text")
        return parquet

    @cached_property
    def _total(self) -> int:
        # The column's uncompressed size in the files' metadata: close to its text bytes
        # (a length before each value), read without reading the data.
        total = 0
        for path in self.files:
            metadata = self._open(path).metadata
            for g in range(metadata.num_row_groups):
                group = metadata.row_group(g)
                for c in range(group.num_columns):
                    column = group.column(c)
                    if column.path_in_schema == self.field:
                        total += int(column.total_uncompressed_size)
        return total

    @property
    def total_bytes(self) -> int | None:
        return self._total

    def describe(self) -> str:
        return f"parquet {self.path} ({_count(self.files)}, column {self.field!r})"

    def _documents(self) -> Iterator[Document]:
        pa = _pyarrow()
        for path in self.files:
            parquet = self._open(path)
            row = 0
            try:
                for batch in parquet.iter_batches(batch_size=ROW_BATCH, columns=[self.field]):
                    for value in batch.column(0).to_pylist():
                        if value is None:
                            raise DataError(f"{path} row {row}: column {self.field!r} is null")
                        yield Document(f"{path} row {row}", value)
                        row += 1
            except (OSError, pa.ArrowException) as exc:
                raise DataError(f"{path} row {row}: cannot be read ({exc})") from None


class SavedDataset(DocumentSource):
    """A folder written by ``datasets``' ``save_to_disk`` (a dataset, or a dict of splits:
    its "train" split, or its only one), its text in the column ``field``; rows are
    memory-mapped and read a batch at a time."""

    kind = "dataset"

    def __init__(self, path: Path, field: str) -> None:
        super().__init__(path)
        self.field = field
        self.folder = self._split_folder()
        self.dataset = self._load()

    def _split_folder(self) -> Path:
        """The folder of the dataset to read: ``path``, or its chosen split's folder (only
        that split is loaded: ``load_from_disk`` of the whole dict would open them all)."""
        index = self.path / "dataset_dict.json"
        if not index.is_file():
            return self.path
        try:
            splits = [str(s) for s in json.loads(index.read_text())["splits"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{index}: unreadable list of splits ({exc})") from None
        if "train" in splits:
            return self.path / "train"
        if len(splits) == 1:
            return self.path / splits[0]
        raise DataError(
            f"{self.path}: a dataset of splits {', '.join(splits)}, none of them 'train'; "
            f"point at one split's folder ({self.path / splits[0]})"
        )

    def _load(self) -> Any:
        try:
            import datasets
        except ImportError:
            raise _missing_extra("datasets") from None
        try:
            state = json.loads((self.folder / "state.json").read_text())
        except (OSError, ValueError):
            state = None
        if isinstance(state, dict) and state.get("_data_files") == []:
            # saved without rows: datasets 5 cannot even load it (an IndexError)
            raise DataError(f"{self.folder}: an empty dataset, no document in it")
        try:
            loaded = datasets.load_from_disk(str(self.folder))
        except (OSError, ValueError) as exc:
            # load_from_disk says FileNotFoundError for a folder that is no dataset
            raise DataError(f"{self.folder}: not a dataset saved with datasets ({exc})") from None
        if not isinstance(loaded, datasets.Dataset):
            raise DataError(f"{self.folder}: a {type(loaded).__name__}, not one dataset")
        names = loaded.column_names
        if self.field not in names:
            present = ", ".join(repr(n) for n in names) or "none"
            raise DataError(
                f"{self.folder}: no column {self.field!r} (the columns are {present}); choose "
                "one with --field"
            )
        feature = loaded.features[self.field]
        if getattr(feature, "dtype", None) not in ("string", "large_string"):
            raise DataError(f"{self.folder}: column {self.field!r} holds {feature}, not text")
        return loaded.select_columns([self.field])

    @cached_property
    def _total(self) -> int:
        # the column's Arrow buffers (text and offsets), memory-mapped: known unread
        return int(self.dataset.data.column(self.field).nbytes)

    @property
    def total_bytes(self) -> int | None:
        return self._total

    def describe(self) -> str:
        return f"dataset {self.folder} (column {self.field!r})"

    def _documents(self) -> Iterator[Document]:
        row = 0
        for batch in self.dataset.iter(batch_size=ROW_BATCH):
            for value in batch[self.field]:
                where = f"{self.folder} row {row}"
                if value is None:
                    raise DataError(f"{where}: column {self.field!r} is null")
                yield Document(where, value)
                row += 1


def guess_format(path: Path) -> str:
    """Which of :data:`FORMATS` ``path`` holds, from its name or its folder's files."""
    if path.is_file():
        if _is_jsonl(path):
            return "jsonl"
        return "parquet" if _is_parquet(path) else "text"
    if any((path / marker).is_file() for marker in DATASET_MARKERS):
        return "dataset"
    files = _walk(path)
    jsonl = sum(map(_is_jsonl, files))
    parquet = sum(map(_is_parquet, files))
    if jsonl and parquet:
        raise DataError(
            f"{path}: holds both .jsonl and .parquet files; choose one with --format "
            "(or put them in separate folders)"
        )
    found, fmt = (jsonl, "jsonl") if jsonl else (parquet, "parquet") if parquet else (0, "text")
    if found and found < len(files):
        # A downloaded dataset's README or license sits beside its data files.
        log.info(
            "%s: reading its %d %s files, not its %d others", path, found, fmt, len(files) - found
        )
    return fmt


def open_documents(path: Path, fmt: str | None = None, field: str = "text") -> DocumentSource:
    """The documents of ``path`` in format ``fmt`` (one of :data:`FORMATS`), or in the
    format its name or content says (see :func:`guess_format`). ``field`` is the JSON
    field, or the column, that holds the text. Raises :class:`DataError`."""
    path = path.expanduser()
    if not path.exists():
        raise DataError(f"{path} does not exist")
    if not (path.is_file() or path.is_dir()):
        raise DataError(f"{path} is neither a file nor a folder")
    if fmt is None:
        fmt = guess_format(path)
    if fmt == "text":
        return TextFiles(path)
    if fmt == "jsonl":
        return JsonLines(path, field)
    if fmt == "parquet":
        return ParquetFiles(path, field)
    if fmt == "dataset":
        return SavedDataset(path, field)
    raise DataError(f"unknown data format {fmt!r}: choose one of {', '.join(FORMATS)}")
