"""Publishing a project (the owner's side): sign the manifest, split the initial weights
into chunks, announce both and serve them. The volunteer's side is core/project/joining.py."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import trio
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from core.data.tokenizer import BYTES, TOKENIZER_FILE, tokenizer_sha256
from core.experts.registry import build_expert
from core.experts.spec import seed_for
from core.experts.weights import WeightsError, canonical_safetensors, load_weights, save_weights
from core.project.chunks import TOKENIZER_ENTRY, ChunkStore, WeightsIndex, split_file
from core.project.distribution import (
    WeightsService,
    announce_project,
)
from core.project.keys import KeyRotation, OwnerKey
from core.project.manifest import ManifestError, ModelSection, load_manifest
from core.project.records import MAX_RECORD_BYTES
from core.project.signed import SignedManifest
from core.protocol.contributions import TRUNK_UID
from net import Peer

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
#: The trainer-side layers' names and shapes for a manifest's model (the trainer's
#: ``core.trainer.initial.trunk_shapes_of``: this layer does not build models)
TrunkShapes = Callable[[ModelSection], Mapping[str, Sequence[int]]]

#: The trainer-side layers' initial weights in a ``[weights] folder`` (a safetensors
#: file of float32 tensors named as the trainer's parameters), published in the signed
#: weights index under the shared trunk's uid (``TRUNK_UID``).
TRUNK_FILE = "trunk.safetensors"


@dataclass(frozen=True)
class Prepared:
    signed: SignedManifest
    store: ChunkStore
    index: WeightsIndex


def prepare(
    manifest_path: Path,
    owner: OwnerKey,
    rotations: tuple[KeyRotation, ...],
    workdir: Path,
    progress: Progress | None = None,
    *,
    trunk_shapes: TrunkShapes | None = None,
) -> Prepared:
    """Check the manifest, make (or read) every expert's weights, split them into chunks,
    and sign. Nothing is published yet. A ``[weights] folder`` holding ``TRUNK_FILE``
    publishes it too, as the trainers' initial layers; ``trunk_shapes`` checks its names
    and shapes (``moehome owner publish`` gives it; without it, each trainer checks them
    when it loads the file). A manifest pinning a tokenizer (``[data] tokenizer``, a
    sha256) publishes the ``tokenizer.json`` beside it (or in the ``[weights] folder``)
    whose sha256 is the pin, under ``TOKENIZER_ENTRY``, for trainers and export."""
    manifest = load_manifest(manifest_path)
    store = ChunkStore(workdir / "chunks", max_bytes=1 << 62)  # the owner keeps everything
    uids = list(manifest.model.expert_uids())
    spec = manifest.model.expert_spec()
    files = {}
    folder = manifest.weights.folder
    if folder is not None:
        folder_path = (manifest_path.parent / folder).resolve()
        if not folder_path.is_dir():
            raise ManifestError([f"weights.folder: {folder_path} is not a folder"])
    for i, uid in enumerate(uids):
        module = build_expert(spec, seed=seed_for(manifest.weights.seed, uid))
        path = workdir / "weights" / f"{uid}.safetensors"
        if folder is not None:
            source = folder_path / f"{uid}.safetensors"
            try:
                # right names and shapes for this expert? (rounded to the project's dtype)
                load_weights(module, source, cast=True)
            except WeightsError as exc:
                raise ManifestError([f"weights.folder: {exc}"]) from exc
        save_weights(module, path, version=0)
        files[uid] = split_file(path.read_bytes(), store)
        if progress is not None:
            progress(i + 1, len(uids))
    if folder is not None and (folder_path / TRUNK_FILE).exists():
        path = workdir / "weights" / TRUNK_FILE
        tensors = read_trunk(folder_path / TRUNK_FILE)
        expected = None if trunk_shapes is None else trunk_shapes(manifest.model)
        if expected is not None:
            check_trunk(tensors, expected, where=f"weights.folder: {TRUNK_FILE}")
        path.write_bytes(canonical_safetensors(save(tensors, metadata={"version": "0"})))
        files[TRUNK_UID] = split_file(path.read_bytes(), store)
    if manifest.data.tokenizer != BYTES:
        places = [manifest_path.parent] + ([folder_path] if folder is not None else [])
        tokenizer = pinned_tokenizer(manifest.data.tokenizer, places, manifest_path.name)
        files[TOKENIZER_ENTRY] = split_file(tokenizer, store)
    index = WeightsIndex(files)
    store.put(index.encode())
    signed = SignedManifest.create(manifest, owner, rotations, index.sha256)
    size = len(signed.encode())
    if size > MAX_RECORD_BYTES:
        raise ManifestError(
            [f"manifest: {size} bytes signed; at most {MAX_RECORD_BYTES} fit the DHT"]
        )
    return Prepared(signed, store, index)


def pinned_tokenizer(pinned: str, places: Sequence[Path], manifest_name: str) -> bytes:
    """The bytes of the first ``tokenizer.json`` in ``places`` whose sha256 is ``pinned``
    (the manifest's ``[data] tokenizer``), or a ``ManifestError`` saying where to put it.
    Data, never code: only its hash is read here."""
    other = []
    for place in places:
        path = place / TOKENIZER_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ManifestError([f"data.tokenizer: cannot read {path}: {exc}"]) from exc
        if tokenizer_sha256(data) == pinned:
            return data
        other.append(f"{path} is {tokenizer_sha256(data)[:12]}...")
    found = f" ({'; '.join(other)})" if other else ""
    raise ManifestError(
        [
            f"data.tokenizer: no tokenizer.json of sha256 {pinned[:12]}... found; put the "
            f"tokenizer.json the manifest pins beside {manifest_name}{found}"
        ]
    )


def read_trunk(path: Path) -> dict[str, torch.Tensor]:
    """A trunk file's tensors, float32 (a ``ManifestError`` naming the file otherwise)."""
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ManifestError([f"weights.folder: cannot read {path}: {exc}"]) from exc
    odd = sorted(k for k, t in tensors.items() if t.dtype != torch.float32)
    if odd:
        raise ManifestError([f"weights.folder: {path}: {odd[0]} is not float32"])
    return tensors


def check_trunk(
    tensors: Mapping[str, torch.Tensor], expected: Mapping[str, Sequence[int]], *, where: str
) -> None:
    """The names and shapes of ``tensors`` are ``expected``'s, or a ``ManifestError``
    naming the first key that differs."""
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise ManifestError(
            [f"{where}: missing {missing[:3]}, unexpected {extra[:3]} (the trainer's layers)"]
        )
    for key, shape in expected.items():
        if tuple(tensors[key].shape) != tuple(shape):
            raise ManifestError(
                [f"{where}: {key} is {list(tensors[key].shape)}, expected {list(shape)}"]
            )


#: The first re-announcement comes this long after publishing; the waits then double up
#: to the refresh period. The DHT keeps a record on the peers closest to its key when it
#: is put: at publishing, often the bootstrap peer alone, and a swarm grows most just
#: after (volunteers follow the invite). Re-announced, the record moves to them.
FIRST_REANNOUNCE_S = 10.0


def announce_waits(refresh: float, first: float = FIRST_REANNOUNCE_S) -> Iterator[float]:
    """The waits between announcements: ``first``, doubling, then ``refresh`` on."""
    wait = min(first, refresh)
    while True:
        yield wait
        wait = min(2 * wait, refresh)


async def serve_project(
    peer: Peer,
    prepared: Prepared,
    *,
    refresh: float = 600.0,
    task_status: trio.TaskStatus[WeightsService] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Announce the project and serve its weights, re-announcing soon after publishing
    and then every ``refresh`` s (announce_waits); DHT trouble is logged, serving goes on."""
    service = WeightsService.of(peer, prepared.store)
    ttl = 3 * refresh
    await announce_project(peer, prepared.signed, ttl=ttl)
    await _announce_weights(service, prepared, ttl)
    task_status.started(service)
    for wait in announce_waits(refresh):
        await trio.sleep(wait)
        await announce_project(peer, prepared.signed, ttl=ttl)
        await _announce_weights(service, prepared, ttl)


async def _announce_weights(service: WeightsService, prepared: Prepared, ttl: float) -> None:
    try:
        await service.announce(prepared.signed.project_id, prepared.index.sha256, ttl=ttl)
    except Exception as exc:  # noqa: BLE001 - DHT trouble is logged, serving goes on
        log.warning("could not announce the weights: %s", exc)
