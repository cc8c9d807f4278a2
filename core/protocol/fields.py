"""Checked fields of signed messages: every decoder refuses a field of the wrong type or
size with a MessageError naming it."""

from __future__ import annotations

import math
from typing import Any

from net.codec import unpack_bounded


class MessageError(ValueError):
    """A message is malformed (not: a valid message with a bad claim)."""


def unpack_message(data: bytes, max_bytes: int, what: str) -> Any:
    """Bounded msgpack (net.codec.unpack_bounded) of a message; garbage is a
    MessageError saying it is not ``what``."""
    try:
        return unpack_bounded(data, max_bytes)
    except Exception as exc:  # msgpack's errors on garbage
        raise MessageError(f"not {what}: {exc}") from exc


def exact_bytes(x: Any, n: int, what: str) -> bytes:
    if not isinstance(x, bytes) or len(x) != n:
        raise MessageError(f"{what} must be {n} bytes")
    return x


def bounded_int(x: Any, what: str, high: int = 2**62) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < high:
        raise MessageError(f"{what} must be an integer in 0..{high}")
    return x


def short_str(x: Any, what: str, limit: int = 64) -> str:
    if not isinstance(x, str) or not 0 < len(x) <= limit:
        raise MessageError(f"{what} must be a string of 1..{limit} characters")
    return x


def nonnegative_float(x: Any, what: str) -> float:
    """A finite number >= 0 (an int is taken as a float; a bool is no number)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise MessageError(f"{what} must be a number")
    value = float(x)
    if not math.isfinite(value) or value < 0:
        raise MessageError(f"{what} must be finite and >= 0")
    return value
