"""Signed evaluations: a trainer's word of its validation loss at a step, so that anyone
can draw a project's loss over time from data the project's own keys signed (the project
page, core/project/page.py). A trainer sends each point to the project's aggregators,
which keep them (core/aggregator/evaluations.py) and hand them to anyone who asks.

agg.evaluation   meta {point: bytes}  (only the manifest's trainers) -> meta {}
agg.evaluations  meta {after: float}  -> meta {points: [bytes], more: bool}: the points
                 issued after that time, oldest first, at most MAX_POINTS_PER_REPLY

Canonical msgpack, bounded decoding, a signature over exact bytes, as credit statements.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from core.protocol.fields import MessageError, nonnegative_float, unpack_message
from core.protocol.fields import bounded_int as _int
from core.protocol.fields import exact_bytes as _bytes
from core.protocol.fields import short_str as _str
from net.codec import pack
from net.identity import Identity, verify_signature

EVALUATION: Final = "agg.evaluation"
EVALUATIONS: Final = "agg.evaluations"
_DOMAIN: Final = "moehome-evaluation/1"
MAX_POINT_BYTES: Final = 512
#: points in one agg.evaluations reply: they travel in the RPC header (64 KiB)
MAX_POINTS_PER_REPLY: Final = 256


@dataclass(frozen=True)
class EvaluationPoint:
    project: str
    #: the trainer's Ed25519 public key (one of the manifest's trainers)
    trainer: bytes
    #: the trainer's optimizer steps, and the samples and tokens they trained on
    step: int
    samples: int
    tokens: int
    #: mean validation loss, nats per token
    loss: float
    #: when it was measured (unix seconds)
    time: float
    signature: bytes = b""

    def payload(self) -> bytes:
        """What the trainer signs: every field but the signature, under a domain."""
        return pack([_DOMAIN, *self.to_obj()[:-1]])

    @classmethod
    def sign(
        cls,
        trainer: Identity,
        project: str,
        *,
        step: int,
        samples: int,
        tokens: int,
        loss: float,
        time: float,
    ) -> EvaluationPoint:
        unsigned = cls(
            project, trainer.public_key, int(step), int(samples), int(tokens), float(loss), time
        )
        return replace(unsigned, signature=trainer.sign(unsigned.payload()))

    def verify(self) -> bool:
        return verify_signature(self.trainer, self.payload(), self.signature)

    def to_obj(self) -> list[Any]:
        return [
            self.project,
            self.trainer,
            self.step,
            self.samples,
            self.tokens,
            self.loss,
            self.time,
            self.signature,
        ]

    @classmethod
    def from_obj(cls, obj: Any) -> EvaluationPoint:
        if not isinstance(obj, list) or len(obj) != 8:
            raise MessageError("an evaluation is a list of 8 fields")
        return cls(
            _str(obj[0], "project"),
            _bytes(obj[1], 32, "trainer"),
            _int(obj[2], "step"),
            _int(obj[3], "samples"),
            _int(obj[4], "tokens"),
            nonnegative_float(obj[5], "loss"),
            nonnegative_float(obj[6], "time"),
            _bytes(obj[7], 64, "signature"),
        )

    def encode(self) -> bytes:
        return pack(self.to_obj())

    @classmethod
    def decode(cls, data: Any) -> EvaluationPoint:
        if not isinstance(data, bytes) or len(data) > MAX_POINT_BYTES:
            raise MessageError(f"an evaluation is at most {MAX_POINT_BYTES} bytes")
        return cls.from_obj(unpack_message(data, MAX_POINT_BYTES, "an evaluation"))
