"""The light commands start without torch (1.7 s of a 3 s start on these machines): an
owner polling ``owner status``, a volunteer's ``moehome credit``, the project page. The
import rules (pyproject.toml) say so of the modules; this checks what real processes
load, lazy imports included."""

from __future__ import annotations

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


def loaded_torch(code: str) -> bool:
    done = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint('torch' in sys.modules)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1] == "True"


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
