"""Where moehome keeps its files: the user's data and config folders (platformdirs).

``MOEHOME_DATA_DIR`` and ``MOEHOME_CONFIG_DIR`` override them (tests, several nodes on one
machine, portable installs).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "moehome"


def data_dir() -> Path:
    override = os.environ.get("MOEHOME_DATA_DIR")
    return Path(override) if override else platformdirs.user_data_path(APP_NAME, appauthor=False)


def config_dir() -> Path:
    override = os.environ.get("MOEHOME_CONFIG_DIR")
    return Path(override) if override else platformdirs.user_config_path(APP_NAME, appauthor=False)


#: The roles that run as their own peer, each with its own key on one computer: a peer
#: refuses to dial itself, so an owner's publisher, aggregator and trainer sharing one
#: identity could not reach each other (and a ban of one would be a ban of all).
ROLES = ("node", "peer", "owner", "aggregator", "trainer", "account")


def identity_path(base: Path | None = None, role: str = "node") -> Path:
    """The key file of ``role``: the volunteer's node keeps ``identity.key`` (what
    ``moehome id`` shows); every other role ``identity-<role>.key`` beside it."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    name = "identity.key" if role == "node" else f"identity-{role}.key"
    return (base or data_dir()) / name
