"""Checks a contribution must pass before the aggregator trusts it. Pure: every fact it
needs (current version, seen nonces, allowed trainers) is passed in."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import torch

from core.contributing.codecs import CodecError, codec
from core.protocol.contributions import TRUNK_UID, Contribution, tensor_digest
from core.protocol.refusals import Refusal

#: how far a contribution's clock may be from ours
CLOCK_SKEW_S: Final = 600


class Rejected(Exception):
    """A contribution was refused; ``reason`` is counted per reason."""

    def __init__(self, reason: Refusal, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class VerifyContext:
    project: str
    params: Mapping[str, Mapping[str, int]]  # uid -> parameter name -> numel, in order
    current_version: Mapping[str, int]  # uid -> version
    staleness_bound: int
    trainers: Collection[bytes]  # public keys the manifest allows to sign receipts
    seen_nonces: Collection[bytes]
    seen_batches: Collection[bytes]
    now: float
    max_samples: int = 1 << 30


def verify(
    c: Contribution, parts: Sequence[torch.Tensor], ctx: VerifyContext
) -> dict[str, torch.Tensor]:
    """The decoded gradient sums (parameter name -> flat float32), or Rejected."""
    check_claims(c, ctx)
    return check_payload(c, parts)


def check_claims(c: Contribution, ctx: VerifyContext, payload_bytes: int | None = None) -> None:
    """Every check that needs neither a signature nor the payload: cheap enough to run
    on a request's header before its payload is read. ``payload_bytes``: what the
    request says will follow (checked against what the codec makes of the params)."""
    if c.project != ctx.project:
        raise Rejected(Refusal.WRONG_PROJECT, c.project)
    expected = ctx.params.get(c.uid)
    if expected is None:
        raise Rejected(Refusal.UNKNOWN_EXPERT, c.uid)
    if c.uid == TRUNK_UID and (
        c.contributor not in ctx.trainers or any(r.trainer != c.contributor for r in c.receipts)
    ):
        raise Rejected(Refusal.NOT_A_TRAINER, "only the project's trainers change the trunk")
    if c.nonce in ctx.seen_nonces:
        raise Rejected(Refusal.REPLAY, "this contribution was received before")
    if abs(c.timestamp - ctx.now) > CLOCK_SKEW_S:
        raise Rejected(Refusal.CLOCK, f"timestamp {c.timestamp - ctx.now:+.0f} s from ours")
    current = ctx.current_version[c.uid]
    if c.base_version > current:
        raise Rejected(Refusal.FUTURE_VERSION, f"base {c.base_version} > current {current}")
    if current - c.base_version > ctx.staleness_bound:
        raise Rejected(
            Refusal.STALE, f"base {c.base_version}, current {current}, bound {ctx.staleness_bound}"
        )
    if not c.receipts:
        raise Rejected(Refusal.NO_RECEIPTS)
    batches = set()
    for r in c.receipts:
        # membership first: a receipt of no trainer of ours costs no signature check
        if r.trainer not in ctx.trainers:
            raise Rejected(
                Refusal.FOREIGN_RECEIPT, "a receipt not signed by a trainer of this project"
            )
        if r.project != c.project or r.uid != c.uid or r.version != c.base_version:
            raise Rejected(Refusal.FOREIGN_RECEIPT, "a receipt for another expert or version")
        if r.batch_id in ctx.seen_batches or r.batch_id in batches:
            raise Rejected(Refusal.RECEIPT_REUSED, "a receipt counted before")
        batches.add(r.batch_id)
    if c.samples != sum(r.samples for r in c.receipts) or not 0 < c.samples <= ctx.max_samples:
        raise Rejected(
            Refusal.INFLATED_SAMPLES,
            f"claims {c.samples}, receipts sum to {sum(r.samples for r in c.receipts)}",
        )
    if [(p.name, p.numel) for p in c.params] != list(expected.items()):
        raise Rejected(Refusal.SHAPE, "parameters do not match the expert's")
    try:
        chosen = codec(c.codec)
    except CodecError as exc:
        raise Rejected(Refusal.CODEC, str(exc)) from exc
    if payload_bytes is not None:
        size = sum(chosen.encoded_bytes(p.numel) for p in c.params)
        if payload_bytes != size:
            raise Rejected(Refusal.SHAPE, f"{payload_bytes} payload bytes, {c.codec} makes {size}")


def check_payload(c: Contribution, parts: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Signatures (the contribution's and every receipt's), the payload's digest, the
    decoded gradients. Needs no state of the aggregator: runs in any worker thread."""
    if not c.verify_signature():
        raise Rejected(Refusal.BAD_SIGNATURE, "contribution not signed by its contributor")
    for r in c.receipts:
        if not r.verify():
            raise Rejected(
                Refusal.FOREIGN_RECEIPT, "a receipt not signed by a trainer of this project"
            )
    if tensor_digest(parts) != c.payload_sha256:
        raise Rejected(Refusal.PAYLOAD_MISMATCH, "tensors do not match the signed digest")
    return decode_gradients(c, parts)


def decode_gradients(c: Contribution, parts: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each parameter's gradient from the contribution's encoded parts; Rejected when
    they do not decode or hold NaN or infinity."""
    chosen = codec(c.codec)
    per_param = len(parts) // len(c.params) if c.params else 0
    if per_param * len(c.params) != len(parts) or per_param == 0:
        raise Rejected(Refusal.SHAPE, "wrong number of tensor parts")
    grads: dict[str, torch.Tensor] = {}
    for i, p in enumerate(c.params):
        try:
            g = chosen.decode(parts[i * per_param : (i + 1) * per_param], p.numel)
        except CodecError as exc:
            raise Rejected(Refusal.SHAPE, f"{p.name}: {exc}") from exc
        if not torch.isfinite(g).all():
            raise Rejected(Refusal.NON_FINITE, f"{p.name} holds NaN or infinity")
        grads[p.name] = g
    return grads
