"""The desktop bundle, built for real with PyInstaller (installer/build.py) and run from
its folder: `moehome --version`, `moehome node --selftest` (device benchmark, libp2p
hosts, an expert forward on the CPU, probes) and `moehome-tray --selftest` offscreen
(which also checks that the tray loaded neither torch, trio nor libp2p). Slow: the build
takes ~4 minutes on a 2-core machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_bundle_builds_and_runs(tmp_path):
    built = subprocess.run(
        [
            sys.executable,
            str(ROOT / "installer" / "build.py"),
            "--dist",
            str(tmp_path / "dist"),
            "--work",
            str(tmp_path / "work"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    report = json.loads(built.stdout.strip().splitlines()[-1])
    bundle = Path(report["bundle"])
    assert report["bundle_mb"] > 100  # torch is in
    assert {"moehome", "moehome-tray"} <= set(report["executables"])
    exe = ".exe" if os.name == "nt" else ""
    env = {
        **os.environ,
        "MOEHOME_DATA_DIR": str(tmp_path / "data"),
        "MOEHOME_CONFIG_DIR": str(tmp_path / "config"),
        "QT_QPA_PLATFORM": "offscreen",
    }

    def run(*args: str) -> str:
        done = subprocess.run(
            [str(bundle / args[0]) + exe, *args[1:]],
            cwd=tmp_path,  # not the source tree: nothing may come from it
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, f"{args}: {done.stdout[-2000:]} {done.stderr[-3000:]}"
        return done.stdout

    assert run("moehome", "--version").startswith("moehome ")
    out = run("moehome", "node", "--selftest")
    checks = ("device benchmark", "libp2p hosts", "expert forward", "probes", "training text")
    for check in checks:
        assert f"ok   {check}:" in out
    assert "tray selftest: ok" in run("moehome-tray", "--selftest")
    if sys.platform.startswith("linux"):
        desktop = (bundle / "moehome.desktop").read_text()
        assert "Exec=moehome-tray" in desktop
        assert (bundle / "moehome.png").stat().st_size > 1000
