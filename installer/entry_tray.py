"""The bundle's `moehome-tray` executable (no torch: it only talks to the node): the
launcher, which runs this same executable again as the tray and restarts it after a crash."""

import sys

from app.launcher import main

if __name__ == "__main__":
    sys.exit(main())
