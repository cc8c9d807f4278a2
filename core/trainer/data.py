"""Training data of a byte-level language model (vocabulary 256: one token per byte).

The default corpus is the Python standard library's own source files: every machine that
runs this program has them (no download, no network), they are real text of a stable
size, and every participant reads the same bytes in the same order, so losses compare
across machines. Any folder of text files (or a single text file) can replace it.

Files are concatenated in sorted order, each followed by a newline, up to a byte budget;
the held-out validation bytes are the *end* of that text, so they never overlap the
training bytes. Batches are random windows of ``context + 1`` bytes (inputs and
next-byte targets); evaluation batches sit at fixed, evenly spaced offsets so that a
validation loss means the same thing in every run and after every restart.
"""

from __future__ import annotations

import codecs
import logging
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import torch

from core.data.errors import DataError

log = logging.getLogger(__name__)

STDLIB: Final = "stdlib"
DEFAULT_MAX_BYTES: Final = 32 * 1024 * 1024

#: How much of a file decides whether it looks like text: enough to catch binary formats
#: (their headers hold NUL bytes early) without reading large files whole.
_SNIFF_BYTES: Final = 8 * 1024
#: Files are read in pieces of at most this size, so that a huge budget never allocates a
#: buffer of the whole budget for each (possibly tiny) file.
_READ_CHUNK: Final = 1024 * 1024
#: The validation split never gets smaller than this (unless the text is tiny): a handful
#: of bytes would give a loss too noisy to compare.
_MIN_VALIDATION_BYTES: Final = 1024
#: Folders of the standard library that hold installed third-party packages, or caches,
#: rather than the standard library itself; they differ between machines.
_STDLIB_SKIPPED_DIRS: Final = frozenset({"site-packages", "dist-packages", "__pycache__"})


@dataclass(frozen=True)
class Corpus:
    """Bytes to train on and held-out bytes to evaluate on (both 1-D ``torch.uint8``)."""

    train: torch.Tensor
    validation: torch.Tensor
    files: int
    source: str

    @property
    def total_bytes(self) -> int:
        return int(self.train.numel() + self.validation.numel())


def stdlib_sources() -> list[Path]:
    """The standard library's ``.py`` files (``sysconfig.get_paths()["stdlib"]``), sorted,
    without site-packages, dist-packages and ``__pycache__``; the same order on every
    machine with the same Python. Empty when the sources are missing (a frozen build)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        return []
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruned in place so that os.walk does not descend into installed packages.
        dirnames[:] = [d for d in dirnames if d not in _STDLIB_SKIPPED_DIRS]
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath, name)
                if path.is_file() and not path.is_symlink():
                    found.append(path)
    return sorted(found)


#: In a packaged build (PyInstaller), beside the executables: a copy of the standard
#: library's sources made by installer/build.py, so that "stdlib" (``moehome demo``'s
#: default) works without Python's sources on the machine.
BUNDLED_CORPUS: Final = "corpus"


def bundled_corpus() -> list[Path]:
    """The packaged build's copy of the standard library's sources; empty elsewhere."""
    if not getattr(sys, "frozen", False):
        return []
    folder = Path(sys.executable).resolve().parent / BUNDLED_CORPUS
    return text_files(folder) if folder.is_dir() else []


def _looks_like_text(path: Path) -> bool:
    """The first 8 KiB hold no NUL byte and decode as UTF-8. A multibyte character cut by
    the 8 KiB boundary is fine: only a file shorter than that must end complete."""
    try:
        with path.open("rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError as exc:
        log.debug("skipping %s: %s", path, exc)
        return False
    if not head or b"\0" in head:
        # An empty file teaches nothing; NUL bytes mark binary formats.
        return False
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(head, final=len(head) < _SNIFF_BYTES)
    except UnicodeDecodeError:
        return False
    return True


def text_files(folder: Path) -> list[Path]:
    """Regular files under ``folder`` (recursive, sorted) that look like text: their first
    8 KiB hold no NUL byte and decode as UTF-8. Hidden files and folders (a name starting
    with ".", such as .git) and symbolic links are skipped: links could lead outside the
    folder, or read the same file twice."""
    candidates: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [
            d for d in dirnames if not d.startswith(".") and not Path(dirpath, d).is_symlink()
        ]
        for name in filenames:
            path = Path(dirpath, name)
            if name.startswith(".") or path.is_symlink() or not path.is_file():
                continue
            candidates.append(path)
    text: list[Path] = []
    other: list[Path] = []
    for path in sorted(candidates):
        (text if _looks_like_text(path) else other).append(path)
    if other:  # said, not dropped without a word
        log.warning(
            "skipping %d of %d files in %s that are not UTF-8 text (binary, or another "
            "encoding: convert them to UTF-8 to train on them), e.g. %s",
            len(other),
            len(candidates),
            folder,
            other[0].relative_to(folder),
        )
    return text


def _sources(source: str | Path) -> tuple[list[Path], str]:
    """The files to read for ``source``, and how to name it on screen."""
    if isinstance(source, str) and source == STDLIB:
        files = stdlib_sources() or bundled_corpus()
        if not files:
            raise DataError(
                "the Python standard library's source files are not on this machine "
                "(a packaged build ships without them): point --data at a folder of text files"
            )
        return files, STDLIB
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(f"{path} does not exist: point --data at a folder of text files")
    if path.is_file():
        if not _looks_like_text(path):
            raise DataError(
                f"{path} does not look like text (UTF-8 without NUL bytes): "
                "point --data at a text file or a folder of text files"
            )
        return [path], str(path)
    if not path.is_dir():
        raise DataError(f"{path} is neither a folder nor a file: point --data at a folder")
    files = text_files(path)
    if not files:
        raise DataError(
            f"no text files in {path} (UTF-8 without NUL bytes, hidden files skipped): "
            "point --data at a folder of text files"
        )
    return files, str(path)


def _read_prefix(path: Path, budget: int, into: bytearray) -> None:
    """Append at most ``budget`` bytes of ``path`` to ``into``, never reading more: a file
    of many gigabytes costs only what the budget takes from it."""
    with path.open("rb") as f:
        while budget > 0:
            chunk = f.read(min(budget, _READ_CHUNK))
            if not chunk:
                return
            into += chunk
            budget -= len(chunk)


def load_corpus(
    source: str | Path = STDLIB,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    validation_fraction: float = 0.05,
    min_bytes: int = 4096,
) -> Corpus:
    """Read ``source`` (``"stdlib"``, a folder of text files, or one text file) into at
    most ``max_bytes`` bytes: each file in sorted order followed by a newline, the last one
    cut at the budget. The last ``validation_fraction`` of the bytes (at least 1 KiB, at
    most half) is held out for validation. Raises :class:`DataError`."""
    if not 0 < validation_fraction < 0.5:
        raise DataError(
            f"the validation fraction must be between 0 and 0.5 (exclusive), "
            f"got {validation_fraction}"
        )
    if min_bytes < 2:
        # Two bytes are the least that splits into a train and a validation part.
        raise DataError(f"the minimum amount of text must be at least 2 bytes, got {min_bytes}")
    if max_bytes < min_bytes:
        raise DataError(
            f"the text budget ({max_bytes} bytes) is below the {min_bytes} bytes training "
            "needs: raise the budget"
        )
    files, label = _sources(source)

    buffer = bytearray()
    read = 0
    for path in files:
        remaining = max_bytes - len(buffer)
        if remaining <= 0:
            break
        before = len(buffer)
        try:
            _read_prefix(path, remaining, buffer)
        except OSError as exc:
            # A file can vanish or lose its permissions between listing and reading; the
            # rest of the folder is still worth training on.
            log.debug("skipping unreadable %s: %s", path, exc)
            del buffer[before:]
            continue
        read += 1
        if len(buffer) < max_bytes:
            # Separates files so that one file's end does not run into the next's start.
            buffer += b"\n"

    total = len(buffer)
    if total < min_bytes:
        raise DataError(
            f"training needs at least {min_bytes} bytes of text, found {total} in {label}: "
            "point --data at a folder with more text"
        )
    n_validation = min(max(int(total * validation_fraction), _MIN_VALIDATION_BYTES), total // 2)
    data = torch.frombuffer(buffer, dtype=torch.uint8)
    # Cloned so that each split owns its memory instead of pinning the shared bytearray.
    train = data[: total - n_validation].clone()
    validation = data[total - n_validation :].clone()
    log.info(
        "training text: %d bytes from %d files of %s (%d held out for validation)",
        total,
        read,
        label,
        n_validation,
    )
    return Corpus(train=train, validation=validation, files=read, source=label)


def _check_windows(data: torch.Tensor, batch_size: int, context: int) -> None:
    if data.dim() != 1:
        raise ValueError(f"data must be 1-D, got shape {tuple(data.shape)}")
    if batch_size < 1 or context < 1:
        raise ValueError(f"batch_size and context must be at least 1, got {batch_size}, {context}")
    if data.numel() < context + 1:
        raise ValueError(
            f"{data.numel()} bytes of data are too few for windows of context {context} "
            f"(at least {context + 1} needed)"
        )


def _windows(
    data: torch.Tensor, starts: torch.Tensor, context: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs ``data[s : s + context]`` and targets ``data[s + 1 : s + context + 1]`` for
    each start ``s``, as int64 token ids (what embedding and cross-entropy take)."""
    offsets = starts.to(data.device).unsqueeze(1) + torch.arange(context, device=data.device)
    return data[offsets].long(), data[offsets + 1].long()


def sample_batch(
    data: torch.Tensor, batch_size: int, context: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows: ``x`` ``[batch_size, context]`` int64 token ids and ``y`` the same
    windows shifted by one byte (next-byte targets). The ``generator`` alone decides the
    windows, so a seed reproduces a batch."""
    _check_windows(data, batch_size, context)
    starts = torch.randint(
        0,
        data.numel() - context,
        (batch_size,),
        generator=generator,
        device=generator.device,
    )
    return _windows(data, starts, context)


def validation_batches(
    data: torch.Tensor, batch_size: int, context: int, count: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Deterministic evaluation batches: ``count * batch_size`` windows at evenly spaced
    offsets from the start of ``data`` to its end, the same on every call, so that losses
    compare across runs and restarts."""
    _check_windows(data, batch_size, context)
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    windows = count * batch_size
    last_start = data.numel() - context - 1
    # Integer arithmetic: a float linspace would round offsets of a 32 MiB corpus.
    starts = torch.arange(windows, dtype=torch.int64) * last_start // max(windows - 1, 1)
    return [
        _windows(data, starts[i * batch_size : (i + 1) * batch_size], context) for i in range(count)
    ]
