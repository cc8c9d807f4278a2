"""Where a node starts looking for the swarm: the peers it met before (a cache in its data
folder, so that a second start needs no invite), the peers the app ships with, and the ones
an owner or a volunteer set.

The cache holds only full dialable TCP addresses (the invite's rule); a damaged or hostile
file is read no further than MAX_CACHE_BYTES and bad lines are skipped.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from core.control.invite import check_peer_address
from core.files import replace_file

log = logging.getLogger(__name__)

#: The swarm's well-known peers, shipped with the app. Empty in this source tree: no public
#: swarm runs yet. An owner who ships a build for a project lists its peers here; without a
#: rebuild, ``bootstrap-peers.txt`` in the config folder (one address per line, # comments)
#: replaces this list, and ``MOEHOME_BOOTSTRAP`` (addresses separated by commas or spaces)
#: replaces both.
SHIPPED_BOOTSTRAP_PEERS: Final[tuple[str, ...]] = ()
BOOTSTRAP_FILE: Final = "bootstrap-peers.txt"
BOOTSTRAP_ENV: Final = "MOEHOME_BOOTSTRAP"
MAX_CACHE_BYTES: Final = 64 * 1024
#: Peers kept in the cache (the most recently seen first).
MOST_CACHED: Final = 32


def _valid(addrs: Iterable[str]) -> list[str]:
    out = []
    for addr in addrs:
        try:
            out.append(check_peer_address(addr.strip()))
        except ValueError:
            log.debug("skipping the peer address %r", addr[:100])
    return list(dict.fromkeys(out))


def default_bootstrap_peers(config_dir: Path, environ: dict[str, str] | None = None) -> list[str]:
    """The peers to start from when nobody said otherwise (see SHIPPED_BOOTSTRAP_PEERS)."""
    env = os.environ if environ is None else environ
    if env.get(BOOTSTRAP_ENV, "").strip():
        return _valid(env[BOOTSTRAP_ENV].replace(",", " ").split())
    path = config_dir / BOOTSTRAP_FILE
    try:
        with path.open("rb") as f:
            text = f.read(MAX_CACHE_BYTES).decode(errors="replace")
    except FileNotFoundError:
        return list(SHIPPED_BOOTSTRAP_PEERS)
    except OSError as exc:
        log.warning("cannot read %s: %s", path, exc)
        return list(SHIPPED_BOOTSTRAP_PEERS)
    return _valid(line.split("#", 1)[0] for line in text.splitlines() if line.split("#", 1)[0])


class PeerCache:
    """Peers this node has met, newest first, in ``path`` (JSON: address -> unix time)."""

    def __init__(self, path: Path, most: int = MOST_CACHED) -> None:
        self.path = path
        self.most = most

    def load(self) -> list[str]:
        return list(self._read())

    def remember(self, addrs: Iterable[str], now: float | None = None) -> None:
        """Put ``addrs`` first (seen ``now``); keep the newest ``most``."""
        seen = time.time() if now is None else now
        fresh = dict.fromkeys(_valid(addrs), seen)
        if not fresh:
            return
        merged = {**self._read(), **fresh}
        kept = sorted(merged.items(), key=lambda item: item[1], reverse=True)[: self.most]
        try:
            replace_file(self.path, json.dumps(dict(kept), indent=1).encode())
        except OSError as exc:
            log.warning("cannot save the peers met to %s: %s", self.path, exc)

    def _read(self) -> dict[str, float]:
        try:
            with self.path.open("rb") as f:
                raw = f.read(MAX_CACHE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("cannot read %s: %s", self.path, exc)
            return {}
        try:
            if len(raw) > MAX_CACHE_BYTES:
                raise ValueError(f"larger than {MAX_CACHE_BYTES} bytes")
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            log.warning("ignoring the damaged peer cache %s: %s", self.path, exc)
            return {}
        good = set(_valid(str(k) for k in data))
        entries = {
            str(k): float(v)
            for k, v in data.items()
            if k in good and isinstance(v, int | float) and not isinstance(v, bool)
        }
        return dict(sorted(entries.items(), key=lambda item: item[1], reverse=True))
