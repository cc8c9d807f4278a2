"""The import rules of ARCHITECTURE.md, checked statically (import-linter follows
indirect imports too; this file's own walks of the sources). What a fresh interpreter has
loaded at run time is checked in real processes: tests/processes/test_light_commands.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is part of the dev extras"
    result = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _contracts() -> list[dict[str, Any]]:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _layers(package: str) -> set[str]:
    """Every name the layers contract of ``package`` places (core: full names; net: the
    names inside its container)."""
    (contract,) = [
        c
        for c in _contracts()
        if c.get("type") == "layers"
        and (c.get("containers") == [package] or c["layers"][0].startswith(f"{package}."))
    ]
    named: set[str] = set()
    for layer in contract["layers"]:
        named |= {name.strip() for name in layer.replace(":", "|").split("|")}
    return {n if n.startswith(f"{package}.") else f"{package}.{n}" for n in named}


def _children(package: str) -> set[str]:
    return {
        f"{package}.{p.stem}"
        for p in (ROOT / package).iterdir()
        if (p.is_dir() and (p / "__init__.py").exists())
        or (p.suffix == ".py" and p.stem != "__init__")
    }


@pytest.mark.parametrize("package", ["core", "net"])
def test_every_package_and_module_sits_in_a_layer(package):
    """A new folder or module left out of a layers contract would be free to import
    anything: each contract names every one."""
    assert _children(package) == _layers(package)


def test_net_keeps_its_wings():
    """net/: at most 8 modules at the top besides its wings (transport, rpc, reach, dht,
    testing), so that a new module finds its wing instead of widening the top."""
    top = [p.name for p in (ROOT / "net").glob("*.py") if p.name != "__init__.py"]
    wings = {p.name for p in (ROOT / "net").iterdir() if (p / "__init__.py").exists()}
    assert wings == {"transport", "rpc", "reach", "dht", "testing"}
    assert len(top) <= 8, sorted(top)


RIG = {"core.demo", "core.cli"}


def test_every_product_package_is_forbidden_the_rig():
    """The contract that keeps the rig (net.testing, core.demo) out of the product names
    every package of core/ but the rig and the CLI that starts it."""
    (contract,) = [c for c in _contracts() if "net.testing" in c.get("forbidden_modules", ())]
    assert set(contract["source_modules"]) == (_children("core") - RIG) | {"app"}
    assert set(contract["forbidden_modules"]) == {"net.testing", "core.demo"}


def test_core_and_app_import_only_nets_faces():
    """core/ and app/ import ``net``, a wing (``net.rpc``) or a top module of net
    (``net.identity``), never a module inside a wing nor a private one: the wings may be
    rearranged without touching core. The rig may use the lab (net.testing.lab)."""
    import ast

    reaching = []
    for root in ("core", "app"):
        for path in (ROOT / root).rglob("*.py"):
            relative = path.relative_to(ROOT)
            rig = ".".join(relative.with_suffix("").parts[:2]) in RIG
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom):
                    modules = [node.module or ""]
                elif isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                else:
                    continue
                for module in modules:
                    parts = module.split(".")
                    if parts[0] != "net":
                        continue
                    private = any(p.startswith("_") for p in parts)
                    deep = len(parts) > 2 and not (rig and parts[1] == "testing")
                    if private or deep:
                        reaching.append(f"{relative}:{node.lineno} imports {module}")
    assert not reaching, reaching


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
    """tests/<tier>/: unit (the fast tier), benchmarks (their harness), properties, swarm,
    processes, nat, gui, bundle, gpu (skipped without CUDA); a test file at the top would
    run in no tier of its own (README names the tiers)."""
    tiers = {
        "unit",
        "benchmarks",
        "properties",
        "swarm",
        "processes",
        "nat",
        "gui",
        "bundle",
        "gpu",
    }
    tests = ROOT / "tests"
    assert not sorted(p.name for p in tests.glob("test_*.py"))
    folders = {p.name for p in tests.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == tiers


def test_no_product_file_names_an_attack_or_a_cheat():
    """The rig's dishonest volunteers (core/demo: attacks, cheats) reach the product only
    through hook objects the product defines (an answer hook, a gradient-sums hook): no
    product file outside core/demo and core/cli has a name that speaks of attacking or
    cheating, nor a string that names one of the rig's attacks or cheats. (Prose about
    adversaries, in comments and docstrings, is the defences' own business.)"""
    import ast

    from core.demo.rig import KNOWN

    naming = []
    for root in ("app", "core", "net"):
        for path in (ROOT / root).rglob("*.py"):
            relative = path.relative_to(ROOT)
            if ".".join(relative.with_suffix("").parts[:2]) in RIG:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names: list[str] = []
                if isinstance(node, ast.Name):
                    names = [node.id]
                elif isinstance(node, ast.Attribute):
                    names = [node.attr]
                elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
                    names = [node.arg or ""]
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names = [node.name]
                elif isinstance(node, ast.alias):
                    names = [node.name, node.asname or ""]
                elif isinstance(node, ast.Constant) and node.value in KNOWN:
                    naming.append(f"{relative}:{node.lineno} names {node.value!r}")
                for name in names:
                    if "cheat" in name.lower() or "attack" in name.lower():
                        naming.append(f"{relative}: {name}")
    assert not naming, naming
