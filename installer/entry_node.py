"""The bundle's `moehome` executable: the CLI (the node, the owner's commands, ...)."""

import multiprocessing
import sys

from core.cli import main

if __name__ == "__main__":
    multiprocessing.freeze_support()  # torch may start helper processes on Windows
    sys.exit(main())
