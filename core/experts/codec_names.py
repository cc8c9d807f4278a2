"""The activation codecs' names and a project's choice of them (manifest
``[model.wire]``), without torch: the manifest reads them, and the light commands that
read a manifest do not import torch. The codecs themselves: core/experts/activations.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

ActivationCodec = Literal["raw", "f16", "bf16", "q8", "q4", "q3", "q4z"]
ACTIVATION_CODECS: Final[tuple[str, ...]] = get_args(ActivationCodec)


class ActivationCodecError(ValueError):
    """Parts that do not decode (wrong count, dtype, shape, or a bad scale)."""


@dataclass(frozen=True)
class WireCodecs:
    """A project's choice (manifest ``[model.wire]``): the codec of expert inputs and
    outputs, and that of their gradients."""

    activations: str = "raw"
    gradients: str = "raw"

    def __post_init__(self) -> None:
        check_codec(self.activations)
        check_codec(self.gradients)


def check_codec(name: object) -> str:
    if not isinstance(name, str) or name not in ACTIVATION_CODECS:
        raise ActivationCodecError(
            f"unknown activation codec {str(name)[:20]!r}; known: {', '.join(ACTIVATION_CODECS)}"
        )
    return name
