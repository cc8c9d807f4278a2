"""Where a running node says how to reach it: ``<data dir>/control.json`` (URL) and
``<data dir>/control.token`` (readable by the user only)."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path


def control_file(data_dir: Path) -> Path:
    return data_dir / "control.json"


def token_file(data_dir: Path) -> Path:
    return data_dir / "control.token"


def write_token(data_dir: Path) -> str:
    """A fresh random token, in a file only this user can read."""
    token = secrets.token_urlsafe(32)
    data_dir.mkdir(parents=True, exist_ok=True)
    path = token_file(data_dir)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return token


def write_address(data_dir: Path, url: str, pid: int) -> None:
    path = control_file(data_dir)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"url": url, "pid": pid}))
    os.replace(tmp, path)
