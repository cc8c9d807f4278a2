"""What a volunteer shows of a contribution an aggregator audits (decision 010), on the
wire and back: each receipt's inputs and output gradients, the error-feedback residual
it carried, and the previous contribution whose encoding left that residual. Decoding
checks counts, shapes and dtypes against the contribution before anything is computed;
core/aggregator/audit.py judges what it shows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from core.contributing.codecs import CodecError, codec
from core.experts.registry import ExpertSpec
from core.protocol.contributions import Contribution, MessageError


class RevealError(ValueError):
    """A reveal that does not fit its contribution (counts, shapes, dtypes)."""


@dataclass(frozen=True)
class Reveal:
    """What a volunteer shows of a contribution when it is audited."""

    #: (inputs, output gradients) of each receipt's backward request, in receipt order
    pairs: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    #: the error-feedback residual added before encoding, flat float32 per parameter
    #: (None: none was carried)
    residual: Mapping[str, torch.Tensor] | None = None
    #: the previous contribution whose residual was carried, and its encoded parts
    carried: Contribution | None = None
    carried_parts: tuple[torch.Tensor, ...] = ()

    def to_wire(self) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """The reveal RPC's meta and tensors: each pair's inputs and gradients, then the
        residual's parameters, then the carried contribution's parts."""
        tensors = [t for pair in self.pairs for t in pair]
        meta: dict[str, Any] = {"pairs": len(self.pairs), "residual": self.residual is not None}
        if self.residual is not None:
            tensors.extend(self.residual.values())
        if self.carried is not None:
            meta["carried"] = self.carried.encode()
            tensors.extend(self.carried_parts)
        return meta, tensors

    @classmethod
    def from_wire(
        cls,
        meta: Mapping[str, Any],
        tensors: Sequence[torch.Tensor],
        contribution: Contribution,
        spec: ExpertSpec,
    ) -> Reveal:
        """Check a reveal's counts, shapes and dtypes against ``contribution`` before any
        compute (raises RevealError)."""
        receipts = contribution.receipts
        if meta.get("pairs") != len(receipts):
            raise RevealError(f"a reveal of this contribution has {len(receipts)} pairs")
        has_residual = meta.get("residual") is True
        carried_raw = meta.get("carried")
        if bool(contribution.carried) != isinstance(carried_raw, bytes):
            raise RevealError("the carried contribution must come exactly when one is named")
        carried = None
        if isinstance(carried_raw, bytes):
            try:
                carried = Contribution.decode(carried_raw)
            except MessageError as exc:
                raise RevealError(f"carried contribution: {exc}") from exc
        params = contribution.params
        carried_count = 0
        if carried is not None:
            try:
                per_param = len(codec(carried.codec).encode(torch.zeros(1)))
            except CodecError as exc:
                raise RevealError(str(exc)) from exc
            carried_count = per_param * len(carried.params)
        want = 2 * len(receipts) + (len(params) if has_residual else 0) + carried_count
        if len(tensors) != want:
            raise RevealError(f"expected {want} tensors, got {len(tensors)}")
        pairs = []
        for i, receipt in enumerate(receipts):
            x, g = tensors[2 * i], tensors[2 * i + 1]
            shape_ok = (
                x.dim() == spec.input_ndim
                and x.shape[0] == receipt.samples
                and x.shape[-1] == spec.hidden
                and g.shape == x.shape
            )
            if not shape_ok or x.dtype != spec.torch_dtype or g.dtype != x.dtype:
                raise RevealError(f"pair {i} does not fit receipt {i} and the expert")
            pairs.append((x, g))
        at = 2 * len(receipts)
        residual = None
        if has_residual:
            residual = {}
            for p in params:
                r = tensors[at]
                if r.dtype != torch.float32 or r.numel() != p.numel:
                    raise RevealError(f"the residual of {p.name} must be float32[{p.numel}]")
                residual[p.name] = r.reshape(-1)
                at += 1
        return cls(tuple(pairs), residual, carried, tuple(tensors[at:]))
