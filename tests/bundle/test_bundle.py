"""The desktop bundle, built for real with PyInstaller (installer/build.py) and run from
its folder: `moehome --version`, `moehome node --selftest` (the device it computes on,
device benchmark, libp2p hosts, an expert forward on that device, probes) and
`moehome-tray --selftest` offscreen (which also checks that the tray loaded neither
torch, trio nor libp2p). Slow: the build takes ~3 minutes of one core; on two workers
(``make test``) this test runs first and builds while the other worker runs tests; in a
whole-suite run in one process the build starts with the session, beside the other
tests at the lowest priority, and this test runs last (tests/bundle/building.py).
MOEHOME_BUNDLE=dist/moehome-gpu-cu128 runs it on a bundle built before (the GPU variant,
installer/README.md), which must compute on the GPU where there is one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.node.probes.gpus import SystemGpus
from tests.bundle.building import BUNDLE_BUILD, BundleBuild, bundle_report, prebuilt_bundle

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bundle_build(request: pytest.FixtureRequest) -> Iterator[BundleBuild | None]:
    """The build started with the session (tests/conftest.py), or one started now; None
    for a bundle built before (MOEHOME_BUNDLE)."""
    if prebuilt_bundle() is not None:
        yield None
        return
    started = request.config.stash.get(BUNDLE_BUILD, None)
    build = started or BundleBuild.start(background=False)
    yield build
    if started is None:
        build.remove()


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_bundle_builds_and_runs(tmp_path, bundle_build):
    prebuilt = prebuilt_bundle()
    if bundle_build is None:
        assert prebuilt is not None
        assert prebuilt.is_dir(), f"MOEHOME_BUNDLE={prebuilt}: no such folder"
        report = bundle_report(prebuilt)
    else:
        code, stdout, stderr = bundle_build.wait(timeout=1100)
        assert code == 0, stderr[-4000:]
        report = json.loads(stdout.strip().splitlines()[-1])
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
    checks = (
        "compute device",
        "device benchmark",
        "libp2p hosts",
        "expert forward",
        "probes",
        "training text",
    )
    for check in checks:
        assert f"ok   {check}:" in out
    if "-gpu-" in bundle.name and SystemGpus().nvidia().driver:
        # the GPU variant, on a computer with an NVIDIA GPU, computes on it
        device = next(line for line in out.splitlines() if line.startswith("ok   compute device:"))
        assert device.endswith("(CUDA)"), device
    assert "tray selftest: ok" in run("moehome-tray", "--selftest")
    if sys.platform.startswith("linux"):
        desktop = (bundle / "moehome.desktop").read_text()
        assert "Exec=moehome-tray" in desktop
        assert (bundle / "moehome.png").stat().st_size > 1000
