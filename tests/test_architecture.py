"""The import rules of ARCHITECTURE.md, checked two ways: statically (import-linter follows
indirect imports too) and at run time (what a fresh interpreter has loaded)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is part of the dev extras"
    result = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def loaded_after_import(module: str) -> set[str]:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return {name.split(".")[0] for name in json.loads(out.stdout)}


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("app.main", {"torch", "trio", "libp2p", "net", "safetensors"}),
        ("app.limits", {"torch", "trio"}),  # the tray's widgets, imported on their own
        ("app.dashboard", {"torch", "trio"}),
        ("net", {"torch", "PySide6", "core", "app"}),
        ("net.testing", {"torch", "PySide6", "core", "app"}),
        ("core.cli", {"PySide6", "app", "torch"}),  # --help must stay fast: torch loads lazily
        ("core.control", {"torch", "trio", "libp2p", "net", "PySide6"}),  # the tray's client
    ],
)
def test_modules_loaded_at_run_time(module, forbidden):
    assert not loaded_after_import(module) & forbidden
