"""Render the app icon from its SVG source into what each platform needs: PNGs of the
freedesktop sizes (Linux), moehome.ico (Windows: 16-256 px), moehome.icns (macOS). Uses
Qt's own SVG renderer and its ico/icns image writers, so no other tool is needed.

    python installer/render_icons.py   # writes assets/icons/generated/
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "assets" / "icons" / "moehome.svg"
OUT = ROOT / "assets" / "icons" / "generated"
PNG_SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)
#: icns element types holding PNG data, by pixel size (Apple's "Icon Services" types)
ICNS_TYPES = {16: b"icp4", 32: b"icp5", 64: b"icp6", 128: b"ic07", 256: b"ic08", 512: b"ic09"}


def ico(pngs: dict[int, bytes]) -> bytes:
    """A Windows .ico holding PNG images (Vista and later read PNG entries)."""
    sizes = [s for s in ICO_SIZES if s in pngs]
    header = struct.pack("<HHH", 0, 1, len(sizes))
    offset = len(header) + 16 * len(sizes)
    entries, blobs = b"", b""
    for size in sizes:
        data = pngs[size]
        side = 0 if size >= 256 else size  # 0 means 256 in the directory entry
        entries += struct.pack("<BBBBHHII", side, side, 0, 0, 1, 32, len(data), offset)
        offset += len(data)
        blobs += data
    return header + entries + blobs


def icns(pngs: dict[int, bytes]) -> bytes:
    """A macOS .icns holding PNG images."""
    body = b"".join(
        kind + struct.pack(">I", 8 + len(pngs[size])) + pngs[size]
        for size, kind in ICNS_TYPES.items()
        if size in pngs
    )
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def _png(icon: Any, size: int) -> bytes:
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QSize

    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    icon.pixmap(QSize(size, size)).save(buffer, "PNG")
    buffer.close()
    return bytes(data.data())


def render(out: Path = OUT) -> list[Path]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QSize
    from PySide6.QtGui import QGuiApplication, QIcon

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    icon = QIcon(str(SOURCE))
    if icon.isNull():
        raise SystemExit(f"cannot read {SOURCE}")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for size in PNG_SIZES:
        path = out / f"moehome-{size}.png"
        if not icon.pixmap(QSize(size, size)).save(str(path), "PNG"):
            raise SystemExit(f"cannot write {path}")
        written.append(path)
    pngs = {size: _png(icon, size) for size in {*ICO_SIZES, *ICNS_TYPES}}
    for name, data in (("moehome.ico", ico(pngs)), ("moehome.icns", icns(pngs))):
        path = out / name
        path.write_bytes(data)
        written.append(path)
    del app
    return written


if __name__ == "__main__":
    for path in render():
        sys.stdout.write(f"{path.relative_to(ROOT)} {path.stat().st_size} bytes\n")
