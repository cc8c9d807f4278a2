"""The import rules of ARCHITECTURE.md, checked two ways: statically (import-linter follows
indirect imports too) and at run time (what a fresh interpreter has loaded)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


def _core_layers() -> list[set[str]]:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [
        c for c in config["tool"]["importlinter"]["contracts"] if c.get("type") == "layers"
    ]
    return [
        {name.strip() for name in layer.replace(":", "|").split("|")}
        for layer in contract["layers"]
    ]


def test_every_package_and_module_of_core_sits_in_a_layer():
    """A new folder of core/ left out of the layers contract would be free to import
    anything: the contract names every one."""
    named = set().union(*_core_layers())
    present = {
        f"core.{p.stem}"
        for p in (ROOT / "core").iterdir()
        if (p.is_dir() and (p / "__init__.py").exists())
        or (p.suffix == ".py" and p.stem != "__init__")
    }
    assert present == named


def test_no_import_inside_a_function_crosses_between_core_packages():
    """Imports written inside functions hid upward imports (and a cycle) from readers.
    Two exceptions: the CLI imports lazily so that --help never loads torch, and the
    self-test imports inside each check so that a broken install is reported, check by
    check, instead of stopping the self-test."""
    import ast

    crossing = []
    for path in (ROOT / "core").rglob("*.py"):
        relative = path.relative_to(ROOT).with_suffix("")
        own = ".".join(relative.parts[:2])
        if own == "core.cli" or relative.parts[-1] == "selftest":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("core."):
                    target = ".".join(inner.module.split(".")[:2])  # type: ignore[union-attr]
                    if target != own:
                        crossing.append(f"{relative}:{inner.lineno} imports {inner.module}")
    assert not crossing, crossing


def test_every_test_sits_in_a_tier():
    """tests/<tier>/: unit (the fast tier), properties, swarm, processes, nat, gui, bundle; a test
    file at the top would run in no tier of its own (README names the tiers)."""
    tiers = {"unit", "properties", "swarm", "processes", "nat", "gui", "bundle"}
    tests = ROOT / "tests"
    assert not sorted(p.name for p in tests.glob("test_*.py"))
    folders = {p.name for p in tests.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == tiers
