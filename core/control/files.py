"""Where a running node says how to reach it: ``<data dir>/control.json`` (URL) and
``<data dir>/control.token`` (readable by the user only)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from core.files import replace_file


def control_file(data_dir: Path) -> Path:
    return data_dir / "control.json"


def token_file(data_dir: Path) -> Path:
    return data_dir / "control.token"


def write_token(data_dir: Path) -> str:
    """A fresh random token, in a file only this user can read."""
    token = secrets.token_urlsafe(32)
    replace_file(token_file(data_dir), token, mode=0o600)
    return token


def write_address(data_dir: Path, url: str, pid: int) -> None:
    replace_file(control_file(data_dir), json.dumps({"url": url, "pid": pid}))
