"""The one error of the data pipeline: bad input, said in one sentence."""

from __future__ import annotations

from core.errors import UserFacingError


class DataError(UserFacingError):
    """Training data cannot be read; the message names the file (and row) and what to do."""
