"""Build the desktop bundle: render the icons, run PyInstaller on installer/moehome.spec,
add the Linux desktop entry, and report the bundle's size as one JSON line.

    python installer/build.py [--dist DIR] [--work DIR] [--gpu CUDA_TAG|pypi [--venv DIR]]

The bundle is a folder (dist/moehome/) with `moehome` (CLI and node) and `moehome-tray`.
With ``--gpu cu128`` it is the GPU variant (dist/moehome-gpu-cu128/, several GB), frozen
from an environment of its own (.venv-cu128: made on first use with torch's CUDA build,
as `make setup TORCH=cu128` does), so the CPU environment is left as it is.
With ``--gpu pypi`` (dist/moehome-gpu-pypi/, .venv-pypi, like `make setup TORCH=pypi`)
torch is PyPI's own wheel of the pinned version instead, PyTorch's default build: on
Linux x86_64 a CUDA build, of the CUDA version PyTorch chose for that release; for where
PyTorch's index cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
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

#: PyTorch's index of the builds for one CUDA version, and PyPI for everything else
#: (the Makefile's TORCH_FROM: the same two).
TORCH_INDEX = "https://download.pytorch.org/whl/{tag}"
PYPI = "https://pypi.org/simple"
#: The ``--gpu`` value for torch's default build from PyPI, not PyTorch's index.
PYPI_TAG = "pypi"
#: The bundle's folder: PyInstaller's spec reads its name from here.
NAME_VARIABLE = "MOEHOME_BUNDLE_NAME"


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


def cuda_tag(text: str) -> str:
    if text != PYPI_TAG and not re.fullmatch(r"cu\d{3}", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is no CUDA tag of PyTorch's (cu126, cu128...) nor {PYPI_TAG!r}"
        )
    return text


def pinned_torch() -> str:
    """The torch version that constraints.txt pins (its line ``torch==VERSION``)."""
    found = re.search(r"^torch==(\S+)", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    if found is None:
        raise SystemExit("constraints.txt pins no torch (a line torch==VERSION)")
    return found.group(1)


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def gpu_environment(tag: str, venv: Path) -> Path:
    """The Python of ``venv``, made first if missing, with torch's CUDA build for ``tag``
    (PyPI's default build for ``pypi``; the version constraints.txt pins) and moehome with
    its tools; one whose torch has no CUDA is refused."""
    python = venv_python(venv)
    if not python.exists():
        log.info("[0/3] %s: a new environment with torch's %s build (GBs to download)", venv, tag)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        if tag == PYPI_TAG:
            # PyPI's wheel has no local label: `===` takes exactly the pinned release, which
            # PEP 440 ranks below a local CPU build (2.13.0+cpu) that pip's configuration
            # may offer too (find-links, other indexes)
            index, torch = ["--index-url", PYPI], f"torch==={pinned_torch()}"
        else:
            index = ["--index-url", TORCH_INDEX.format(tag=tag), "--extra-index-url", PYPI]
            torch = "torch"  # `==2.13.0` matches `2.13.0+cu128`
        # torch alone from its index, then the rest
        subprocess.run([*pip, "-c", "constraints.txt", *index, torch], cwd=ROOT, check=True)
        subprocess.run([*pip, "-c", "constraints.txt", "-e", ".[dev]"], cwd=ROOT, check=True)
    found = subprocess.run(
        [str(python), "-c", "import torch; print(torch.__version__, torch.version.cuda or '')"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    version, _, cuda = found.strip().partition(" ")
    if not cuda:
        raise SystemExit(f"the torch in {venv} has no CUDA: delete that folder and build again")
    log.info("%s: torch %s for CUDA %s", venv, version, cuda)
    return python


def build(
    dist: Path, work: Path, python: Path | None = None, name: str = "moehome"
) -> dict[str, object]:
    """The bundle ``dist/name``, frozen by ``python``'s PyInstaller (this one's if None)."""
    t0 = time.monotonic()
    log.info("[1/3] rendering icons")
    render()
    log.info("[2/3] PyInstaller (a few minutes: torch is large)")
    subprocess.run(
        [
            str(python or sys.executable),
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
        env={**os.environ, NAME_VARIABLE: name},
        check=True,
    )
    bundle = dist / name
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
    parser.add_argument("--work", type=Path, help="default: build/pyinstaller[-gpu-TAG]")
    parser.add_argument(
        "--gpu",
        type=cuda_tag,
        metavar="CUDA_TAG",
        help="the GPU variant, with torch's build for this CUDA version (cu128: CUDA 12.8), "
        "or with torch's default build from PyPI (pypi)",
    )
    parser.add_argument("--venv", type=Path, help="the GPU variant's environment (.venv-TAG)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.gpu is None:
        report = build(args.dist, args.work or ROOT / "build" / "pyinstaller")
    else:
        name = f"moehome-gpu-{args.gpu}"
        python = gpu_environment(args.gpu, args.venv or ROOT / f".venv-{args.gpu}")
        report = build(
            args.dist, args.work or ROOT / "build" / f"pyinstaller-gpu-{args.gpu}", python, name
        )
        report["gpu"] = args.gpu
    sys.stdout.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
