"""The trainer-side layers a project starts from: the owner's, when the manifest's
``[weights] folder`` held a ``trunk.safetensors`` (``moehome owner new --from``: a
checkpoint's layers), published in the signed weights index under the shared trunk's
uid; otherwise those the manifest's seed makes (``build_trunk``).

A fresh trainer loads the published trunk into its model before its first step
(core/trainer/train.py), and an aggregator holding the shared trunk starts its versions
from it (core/roles/aggregator.py), so every trainer and the trunk's anchor agree.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch
import trio
from safetensors import SafetensorError
from safetensors.torch import load
from torch import nn

from core.errors import UserFacingError
from core.project.chunks import ChunkStore
from core.project.distribution import FetchError, WeightsFetcher
from core.project.manifest import Manifest, ModelSection
from core.project.signed import SignedManifest
from core.protocol.contributions import TRUNK_UID
from core.trainer.trunk import build_trunk
from net import Peer

log = logging.getLogger(__name__)


class TrunkError(UserFacingError, ValueError):
    """A published trunk that is not this model's trainer-side layers."""


def trunk_shapes_of(model: ModelSection) -> dict[str, tuple[int, ...]]:
    """The names and shapes of the trainer-side parameters of ``model`` (what a trunk
    file holds; ``prepare``'s check at ``moehome owner publish``). Built on the meta
    device: no weights are made."""
    with torch.device("meta"):
        trunk = build_trunk(model, seed=0)
    return {name: tuple(p.shape) for name, p in trunk.named_parameters()}


def may_have_trunk(manifest: Manifest) -> bool:
    """Only a ``[weights] folder`` publishes a trunk (a seeded project's trainers make
    theirs from the seed, with nothing to fetch)."""
    return manifest.weights.folder is not None


def load_trunk(
    model: nn.Module, tensors: Mapping[str, torch.Tensor], manifest: ModelSection
) -> None:
    """Copy ``tensors`` into ``model``'s trainer-side parameters: the names (every one,
    no other) and shapes of ``manifest``'s trainer layers (``trunk_shapes_of``), or a
    ``TrunkError`` naming the first that differs. Other parameters of ``model`` (local
    experts, in tests) are left as they are."""
    expected = trunk_shapes_of(manifest)
    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or extra:
        raise TrunkError(
            f"the published trunk is not this model's trainer layers: missing {missing[:3]}, "
            f"unexpected {extra[:3]}"
        )
    params = dict(model.named_parameters())
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise TrunkError(
                f"the published trunk's {name} is {list(tensors[name].shape)}, "
                f"expected {list(shape)}"
            )
        if name not in params or tuple(params[name].shape) != shape:
            raise TrunkError(f"the model has no parameter {name} of shape {list(shape)}")
    with torch.no_grad():
        for name in expected:
            params[name].copy_(tensors[name].to(params[name].dtype))


def trunk_from_bytes(blob: bytes) -> dict[str, torch.Tensor]:
    try:
        return load(blob)
    except (SafetensorError, ValueError) as exc:
        raise TrunkError(f"the published trunk is not a safetensors file: {exc}") from exc


async def published_trunk(
    fetcher: WeightsFetcher, signed: SignedManifest
) -> dict[str, torch.Tensor] | None:
    """The project's published initial trunk, or None when it has none (a seeded
    project asks no one)."""
    if not may_have_trunk(signed.manifest):
        return None
    try:
        index = await fetcher.index(signed)
        if TRUNK_UID not in index.files:
            return None
        files = await fetcher.fetch(signed, [TRUNK_UID])
    except FetchError as exc:
        raise FetchError(
            f"{exc}: the project's initial weights are the owner's (its [weights] folder); "
            "is `moehome owner publish` running and connected to the swarm?"
        ) from exc
    return await trio.to_thread.run_sync(trunk_from_bytes, files[TRUNK_UID])


async def start_from_published(
    peer: Peer, signed: SignedManifest, model: nn.Module, store: Path
) -> bool:
    """Load the project's published initial trunk into ``model`` (its chunks kept in
    ``store``); False when the project has none (``model`` keeps its seeded layers)."""
    tensors = await published_trunk(WeightsFetcher(peer, ChunkStore(store)), signed)
    if tensors is None:
        return False
    await trio.to_thread.run_sync(load_trunk, model, tensors, signed.manifest.model)
    log.info("starting from the published trainer layers (%d tensors)", len(tensors))
    return True
