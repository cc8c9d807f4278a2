"""``moehome credit``: a volunteer's credit in a project, as the project's aggregators
sign it (core/project/credit_proof.py), asked from a throwaway peer (the node may be
running under its own key; the statements name the node's key, not the asker's)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.namespaces import moehome_validator
from core.project.credit_proof import collect_statements
from core.project.distribution import find_manifest
from core.project.pins import PinStore
from core.project.signed import SignedManifest
from core.protocol.credit import CreditStatement
from core.roles.peer import joined_client
from net.identity import Identity


async def collect_credit(
    contributor: bytes, project_id: str, bootstrap: Sequence[str], data_dir: Path
) -> tuple[SignedManifest, list[CreditStatement], dict[str, str]]:
    """The project's signed manifest, each aggregator's statement about ``contributor``,
    and why the others gave none."""
    async with joined_client(Identity.generate(), bootstrap, validator=moehome_validator()) as peer:
        signed = await find_manifest(peer, project_id, PinStore(data_dir / "pinned-owners.json"))
        statements, missing = await collect_statements(peer, signed, contributor)
        return signed, statements, missing
