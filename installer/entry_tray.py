"""The bundle's `moehome-tray` executable (no torch: it only talks to the node)."""

import sys

from app.main import main

if __name__ == "__main__":
    sys.exit(main())
