"""Trust on first use: the first owner key seen for a project is pinned; a different key
is accepted only through a chain of rotations that passes through the pinned key."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from core.files import replace_file
from core.project.keys import fingerprint
from core.project.signed import ManifestRejected, SignedManifest

log = logging.getLogger(__name__)


class PinStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            raw = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError) as exc:
            raise ManifestRejected("pins", f"cannot read pinned owner keys {path}: {exc}") from exc
        self._pins: dict[str, str] = {k: v for k, v in raw.items() if isinstance(v, str)}

    def pinned(self, project_id: str) -> bytes | None:
        hexkey = self._pins.get(project_id)
        return bytes.fromhex(hexkey) if hexkey else None

    def accept(self, signed: SignedManifest) -> None:
        """Verify ``signed`` against the pin of its project (pinning on first use).
        Raises ManifestRejected("owner_changed") for an unexplained key change."""
        signed.verify()
        pid = signed.project_id
        pinned = self.pinned(pid)
        if pinned is None or pinned == signed.owner_key:
            if pinned is None:
                log.info("pinning owner key %s for project %s", fingerprint(signed.owner_key), pid)
            self._set(pid, signed.owner_key)
            return
        chain = [r.old for r in signed.rotations]
        if pinned not in chain:
            raise ManifestRejected(
                "owner_changed",
                f"project {pid} was signed by {fingerprint(pinned)}; "
                f"{fingerprint(signed.owner_key)} "
                "shows no rotation signed by that key",
            )
        log.warning("owner key of %s rotated to %s", pid, fingerprint(signed.owner_key))
        self._set(pid, signed.owner_key)

    def _set(self, project_id: str, key: bytes) -> None:
        if self._pins.get(project_id) == key.hex():
            return
        self._pins[project_id] = key.hex()
        replace_file(self.path, json.dumps(self._pins, indent=1, sort_keys=True))
