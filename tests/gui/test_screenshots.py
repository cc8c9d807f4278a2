"""Screenshots of the dashboard (with a GPU, and on a computer without one), the menu, the
limits dialog, the wizard's project page and Project… under a real X server
(Xvfb), light and dark, saved as PNG files under artifacts/screenshots/ for a person to
look at. The test checks that each picture was drawn (not blank, a plausible size)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "artifacts" / "screenshots"


def distinct_colours(image: QImage, samples: int = 400) -> int:
    colours = set()
    for i in range(samples):
        x = (i * 7919) % image.width()
        y = (i * 104729) % image.height()
        colours.add(image.pixel(x, y))
    return len(colours)


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("Xvfb") is None, reason="Xvfb is not installed (.ci/run installs it)"
)
def test_screenshots_under_xvfb(tmp_path):
    display = f":{100 + os.getpid() % 500}"
    xvfb = subprocess.Popen(
        ["Xvfb", display, "-screen", "0", "1280x900x24", "-nolisten", "tcp"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        socket = Path(f"/tmp/.X11-unix/X{display[1:]}")
        deadline = time.monotonic() + 10
        while not socket.exists():  # Xvfb is ready once its socket is there
            assert xvfb.poll() is None, "Xvfb exited"
            assert time.monotonic() < deadline, "Xvfb did not start in 10 s"
            time.sleep(0.02)
        env = {**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb"}
        env["MOEHOME_DATA_DIR"] = str(tmp_path / "data")
        env["MOEHOME_CONFIG_DIR"] = str(tmp_path / "config")
        done = subprocess.run(
            [sys.executable, "-m", "tests.screenshots", str(OUT)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        xvfb.terminate()
        xvfb.wait(timeout=10)
    for name in ("dashboard", "menu", "limits", "wizard-project", "project", "dashboard-cpu"):
        for theme in ("light", "dark"):
            image = QImage(str(OUT / f"{name}-{theme}.png"))
            assert not image.isNull(), f"{name}-{theme}.png"
            assert image.width() >= 150
            assert image.height() >= 100
            assert distinct_colours(image) >= 4, f"{name}-{theme}.png looks blank"
