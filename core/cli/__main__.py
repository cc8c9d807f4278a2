"""``python -m core.cli``: what the ``moehome`` command runs (the demo's processes use it)."""

from core.cli.main import main

main()
