"""Bounded, plain msgpack: the one codec of every header and record on the wire.

Signatures cover :func:`pack`'s bytes, so it must stay canonical; :func:`unpack_bounded`
bounds every container before msgpack allocates it and refuses extension types (no
object is ever built from network bytes but lists, maps, strings, bytes and numbers).
"""

from __future__ import annotations

from typing import Any

import msgpack


def pack(obj: Any) -> bytes:
    """Canonical msgpack bytes (what signatures cover)."""
    data = msgpack.packb(obj, use_bin_type=True)
    assert isinstance(data, bytes)
    return data


class NotMsgpack(ValueError):
    """Bytes that are not bounded, plain msgpack (whatever msgpack itself raised)."""


def _refuse_ext(code: int, data: bytes) -> Any:
    raise NotMsgpack(f"msgpack extension type {code} is not allowed")


def unpack_bounded(data: bytes, max_bytes: int) -> Any:
    """msgpack decode with every container bounded and extension types refused. Any
    failure is a NotMsgpack (a ValueError): msgpack raises many types on garbage."""
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            ext_hook=_refuse_ext,
            max_str_len=max_bytes,
            max_bin_len=max_bytes,
            max_array_len=max_bytes,
            max_map_len=max_bytes,
        )
    except NotMsgpack:
        raise
    except Exception as exc:
        raise NotMsgpack(str(exc)[:200]) from exc
