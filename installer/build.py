"""Build the desktop bundle: render the icons, run PyInstaller on installer/moehome.spec,
add the Linux desktop entry, and report the bundle's size as one JSON line.

    python installer/build.py [--dist DIR] [--work DIR]

The bundle is a folder (dist/moehome/) with `moehome` (CLI and node) and `moehome-tray`.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "installer"))
sys.path.insert(1, str(ROOT))  # this tree's core/, also when another checkout is installed

from render_icons import OUT as ICONS  # noqa: E402
from render_icons import render  # noqa: E402

log = logging.getLogger("build")


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


#: How much of the standard library's sources the bundle carries for `moehome demo`.
CORPUS_BYTES = 8 * 2**20


def copy_corpus(folder: Path, budget: int = CORPUS_BYTES) -> None:
    """The first ``budget`` bytes of the standard library's sources (the order the
    trainer reads them), for a bundle that has no Python sources of its own."""
    from core.trainer.data import stdlib_sources

    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in stdlib_sources():
        size = path.stat().st_size
        if total + size > budget:
            break
        target = folder / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        total += size


def build(dist: Path, work: Path) -> dict[str, object]:
    t0 = time.monotonic()
    log.info("[1/3] rendering icons")
    render()
    log.info("[2/3] PyInstaller (a few minutes: torch is large)")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "PyInstaller",
            str(ROOT / "installer" / "moehome.spec"),
            "--noconfirm",
            "--log-level",
            "WARN",
            "--distpath",
            str(dist),
            "--workpath",
            str(work),
        ],
        cwd=ROOT,
        check=True,
    )
    bundle = dist / "moehome"
    log.info("[3/3] training text, desktop entry and icon")
    copy_corpus(bundle / "corpus")
    if sys.platform.startswith("linux"):
        shutil.copy(ROOT / "installer" / "linux" / "moehome.desktop", bundle / "moehome.desktop")
        shutil.copy(ICONS / "moehome-256.png", bundle / "moehome.png")
    size = folder_bytes(bundle)
    torch_dir = next(bundle.rglob("torch"), None)
    return {
        "bundle": str(bundle),
        "bundle_mb": round(size / 2**20, 1),
        "torch_mb": round(folder_bytes(torch_dir) / 2**20, 1) if torch_dir else 0.0,
        "build_s": round(time.monotonic() - t0, 1),
        "executables": sorted(
            p.name for p in bundle.iterdir() if p.is_file() and p.name.startswith("moehome")
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, default=ROOT / "dist")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "pyinstaller")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.stdout.write(json.dumps(build(args.dist, args.work)) + "\n")


if __name__ == "__main__":
    main()
