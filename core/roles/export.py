"""``moehome owner export``'s trio entry point (its own module: it imports the model
family's library, which the other owner commands do without)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.namespaces import moehome_validator
from core.project.distribution import find_manifest
from core.project.pins import PinStore
from core.roles.peer import joined_client
from core.trainer.export import Exported, Progress, export_project
from net import Identity


async def export_once(
    identity: Identity,
    project_id: str,
    bootstrap: Sequence[str],
    data_dir: Path,
    out: Path,
    *,
    workdir: Path,
    tokenizer: Path | None,
    progress: Progress | None = None,
) -> Exported:
    """``moehome owner export``: the project's manifest found, the model written to
    ``out`` (core/trainer/export.py)."""
    async with joined_client(identity, bootstrap, validator=moehome_validator()) as peer:
        signed = await find_manifest(peer, project_id, PinStore(data_dir / "pinned-owners.json"))
        return await export_project(
            peer, signed, out, workdir=workdir, tokenizer=tokenizer, progress=progress
        )
