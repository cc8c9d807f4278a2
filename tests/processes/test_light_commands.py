"""What real processes load, lazy imports included: the import rules of ARCHITECTURE.md
at run time (the tray never loads torch, trio or libp2p; net never loads torch or Qt; the
volunteer's side never loads transformers), and the light commands, which start without
torch (1.7 s of a 3 s start on these machines): an owner polling ``owner status``, a
volunteer's ``moehome credit``, the project page. The import rules (pyproject.toml) say so
of the modules; tests/unit/test_architecture.py checks them statically."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LIGHT_MODULES = (
    "core.cli.main",
    "core.cli.owner",
    "core.cli.credit",
    "core.roles.owner_status",
    "core.roles.credit",
    "core.node.credit",
    "core.project.owner",
    "core.project.credit_proof",
    "core.page.serve",
)


def loaded_by(code: str) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after running ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return {name.split(".")[0] for name in json.loads(done.stdout.strip().splitlines()[-1])}


def loaded_torch(code: str) -> bool:
    return "torch" in loaded_by(code)


def test_the_light_commands_modules_do_not_load_torch():
    assert not loaded_torch("\n".join(f"import {m}" for m in LIGHT_MODULES))
    # the check can fail: the trainer's side does load it
    assert loaded_torch("import core.roles.owner")


@pytest.mark.parametrize(
    ("args", "module"),
    [
        (["owner", "init"], "core.project.owner"),
        # fails (no such file), after importing what verifies
        (["credit", "verify", "no-such.proof"], "core.project.credit_proof"),
    ],
)
def test_a_light_command_runs_without_torch(tmp_path, args, module):
    env = {
        **os.environ,
        "MOEHOME_DATA_DIR": str(tmp_path / "data"),
        "MOEHOME_CONFIG_DIR": str(tmp_path / "config"),
    }
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "core.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()]
    assert module in imported, done.stderr[-2000:]
    assert "torch" not in imported


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("app.main", {"torch", "trio", "libp2p", "net", "safetensors"}),
        # the tray's launcher stays small: it waits beside the tray for hours
        ("app.launcher", {"PySide6", "pyqtgraph", "numpy", "torch", "trio", "core", "net"}),
        ("app.limits", {"torch", "trio"}),  # the tray's widgets, imported on their own
        ("app.dashboard", {"torch", "trio"}),
        ("net", {"torch", "PySide6", "core", "app"}),
        ("net.testing", {"torch", "PySide6", "core", "app"}),
        ("core.cli", {"PySide6", "app", "torch"}),  # --help must stay fast: torch loads lazily
        ("core.control", {"torch", "trio", "libp2p", "net", "PySide6"}),  # the tray's client
    ],
)
def test_modules_loaded_at_run_time(module, forbidden):
    assert not loaded_by(f"import {module}") & forbidden


def test_the_volunteer_side_never_loads_transformers():
    assert "transformers" not in loaded_by(
        "import core.experts.registry, core.experts.backend, core.node.node"
    )
