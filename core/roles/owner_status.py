"""The owner's light commands, one peer each: ``owner status`` (what the project's
aggregators report) and the announcement of a key rotation. Apart from publishing
(core/roles/owner.py): they run without torch, a second or two sooner."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.namespaces import moehome_validator
from core.project.keys import KeyRotation
from core.project.owner import announce_rotation, project_status
from core.roles.peer import joined_client
from net import Identity


async def status_once(
    identity: Identity, project_id: str, bootstrap: Sequence[str], data_dir: Path
) -> dict[str, Any]:
    async with joined_client(identity, bootstrap, validator=moehome_validator()) as peer:
        return await project_status(peer, project_id, data_dir)


async def announce_rotation_once(
    identity: Identity, rotation: KeyRotation, bootstrap: Sequence[str]
) -> int:
    async with joined_client(identity, bootstrap, validator=moehome_validator()) as peer:
        return await announce_rotation(peer, rotation)
