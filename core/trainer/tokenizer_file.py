"""The project's tokenizer.json where a trainer or ``owner export`` needs it: given
(``--tokenizer``), beside token shards, kept in the trainer's work folder, or else fetched
from the swarm: ``owner publish`` publishes the file the manifest pins in the signed
weights index (core/project/publish.py, ``TOKENIZER_ENTRY``), checked here against the
pin. Volunteers never fetch it (they fetch their experts only).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import trio

from core.data.tokenizer import BYTES, TOKENIZER_FILE, tokenizer_sha256
from core.files import replace_file
from core.project.chunks import TOKENIZER_ENTRY, ChunkStore
from core.project.distribution import FetchError, WeightsFetcher
from core.project.signed import SignedManifest
from net import Peer

log = logging.getLogger(__name__)


def _sha256_of(path: Path) -> str | None:
    try:
        return tokenizer_sha256(path.read_bytes())
    except OSError:
        return None


async def published_tokenizer(fetcher: WeightsFetcher, signed: SignedManifest) -> bytes:
    """The bytes of the tokenizer.json the project's manifest pins, fetched through the
    signed weights index (its sha256 the pin), or a ``FetchError`` saying what to do."""
    pinned = signed.manifest.data.tokenizer
    hint = (
        "give the project's tokenizer.json with --tokenizer, or have the owner put it "
        "beside the manifest and run `moehome owner publish` again"
    )
    unreachable = (
        "the project's tokenizer.json comes from the owner; is `moehome owner publish` "
        f"running and connected to the swarm? (or {hint})"
    )
    try:
        index = await fetcher.index(signed)
    except FetchError as exc:
        raise FetchError(f"{exc}: {unreachable}") from exc
    entry = index.files.get(TOKENIZER_ENTRY)
    if entry is None:
        raise FetchError(f"the project's owner published no tokenizer.json: {hint}")
    if entry.sha256 != pinned:
        raise FetchError(
            f"the published tokenizer.json is {entry.sha256[:12]}..., the manifest pins "
            f"{pinned[:12]}...: {hint}"
        )
    try:
        files = await fetcher.fetch(signed, [TOKENIZER_ENTRY])
    except FetchError as exc:
        raise FetchError(f"{exc}: {unreachable}") from exc
    data = files[TOKENIZER_ENTRY]
    if tokenizer_sha256(data) != pinned:  # the index's check, made again on the pin itself
        raise FetchError("the fetched tokenizer.json is not the one the manifest pins")
    return data


async def tokenizer_for(
    peer: Peer,
    signed: SignedManifest,
    workdir: Path,
    *,
    given: Path | None,
    beside: Sequence[Path] = (),
    store: Path,
) -> Path | None:
    """The tokenizer file to hand on: ``given`` when given (or when the project pins
    bytes); None when a ``tokenizer.json`` is ``beside`` token shards (they keep
    theirs); else the work folder's ``tokenizer.json``, fetched from the swarm first
    (chunks kept in ``store``) when it is missing or not the pinned file."""
    pinned = signed.manifest.data.tokenizer
    if given is not None or pinned == BYTES:
        return given
    if any((folder / TOKENIZER_FILE).is_file() for folder in beside):
        return None
    kept = workdir / TOKENIZER_FILE
    held = await trio.to_thread.run_sync(_sha256_of, kept)
    if held == pinned:
        return kept
    if held is not None:
        log.warning("%s is not the tokenizer the project pins; fetching the pinned one", kept)
    data = await published_tokenizer(WeightsFetcher(peer, ChunkStore(store)), signed)
    await trio.to_thread.run_sync(replace_file, kept, data)
    log.info("fetched the project's tokenizer.json (%d bytes) into %s", len(data), kept)
    return kept
