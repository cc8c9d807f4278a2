"""Joining a project (the volunteer's side): find and verify its manifest (pinning the
owner's key), fetch and verify the weights of the chosen experts, build them, and offer the
chunks to others."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from core.experts.backend import DEFAULT_GRAPH_CACHE_BYTES, ExpertBackend
from core.experts.registry import build_expert
from core.experts.uid import ExpertUID
from core.experts.weights import load_weights
from core.project.chunks import ChunkStore
from core.project.distribution import (
    WeightsFetcher,
    WeightsService,
    find_manifest,
)
from core.project.manifest import Manifest, ManifestError, check_uid
from core.project.pins import PinStore
from core.project.signed import SignedManifest
from net import Peer

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


async def join_project(
    peer: Peer,
    project_id: str,
    uids: Sequence[str],
    *,
    data_dir: Path,
    cache_bytes: int = 8 * 2**30,
    progress: Progress | None = None,
    device: str | None = None,
    graph_cache_bytes: int = DEFAULT_GRAPH_CACHE_BYTES,
) -> tuple[SignedManifest, dict[str, ExpertBackend]]:
    """Volunteer side: find the project, verify its manifest (pinning the owner key),
    fetch and verify the weights of ``uids``, and build their experts."""
    pins = PinStore(data_dir / "pinned-owners.json")
    signed = await find_manifest(peer, project_id, pins)
    manifest = signed.manifest
    bad = [u for u in uids if not check_uid(manifest, u)]
    if bad:
        raise ManifestError([f"uid {bad[0]!r} is not on this project's grids"])
    store = ChunkStore(data_dir / "chunks", max_bytes=cache_bytes)
    fetcher = WeightsFetcher(peer, store)
    files = await fetcher.fetch(signed, uids, progress)
    # a volunteer that holds weights can pass them on
    await WeightsService.of(peer, store).announce(project_id, signed.weights_index, uids)
    return signed, await trio.to_thread.run_sync(
        backends_from_files, manifest, files, device, graph_cache_bytes
    )


def backends_from_files(
    manifest: Manifest,
    files: dict[str, bytes],
    device: str | None = None,
    graph_cache_bytes: int = DEFAULT_GRAPH_CACHE_BYTES,
) -> dict[str, ExpertBackend]:
    """Experts built from their weights files, on ``device`` (None: CUDA when present),
    each keeping forward graphs up to ``graph_cache_bytes``."""
    spec = manifest.model.expert_spec()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for uid, blob in files.items():
            path = Path(tmp) / f"{uid}.safetensors"
            path.write_bytes(blob)
            module = build_expert(spec)
            info = load_weights(module, path)
            out[uid] = ExpertBackend(
                ExpertUID.parse(uid),
                spec,
                module,
                version=info.version,
                device=device,
                graph_cache_bytes=graph_cache_bytes,
            )
    return out
