"""The ``moehome`` command (core/cli/main.py), split by command group."""

from core.cli.main import app, main

__all__ = ["app", "main"]
