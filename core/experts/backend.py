"""One served expert: its module, weights identity, input checks, and the gradient
accumulator. Synchronous torch code: the server runs it in its compute thread."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import torch
from torch import nn

from core.experts.registry import ExpertSpec
from core.experts.uid import ExpertUID
from core.experts.weights import weights_hash

log = logging.getLogger(__name__)


class InvalidInput(ValueError):
    """A request's tensors do not fit the expert; the message says how."""


@dataclass
class GradientAccumulator:
    """Sums of parameter gradients since the last take(), with the samples behind them.
    The server never steps an optimizer: aggregators own the model."""

    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    samples: int = 0
    backward_batches: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, module: nn.Module, samples: int) -> None:
        with self._lock:
            for name, p in module.named_parameters():
                if p.grad is None:
                    continue
                g = p.grad.detach().to(torch.float32)
                if name in self.sums:
                    self.sums[name].add_(g.to(self.sums[name].device))
                else:
                    self.sums[name] = g.clone()
                p.grad = None
            self.samples += samples
            self.backward_batches += 1

    def take(self) -> tuple[dict[str, torch.Tensor], int]:
        """The sums and sample count so far; the accumulator starts again from zero."""
        with self._lock:
            sums, samples = self.sums, self.samples
            self.sums, self.samples, self.backward_batches = {}, 0, 0
            return sums, samples


class ExpertBackend:
    def __init__(
        self,
        uid: ExpertUID,
        spec: ExpertSpec,
        module: nn.Module,
        *,
        version: int = 0,
        device: torch.device | str = "cpu",
        max_batch_size: int = 4096,
    ) -> None:
        self.uid = uid
        self.spec = spec
        self.device = torch.device(device)
        self.module = module.to(self.device)
        self.module.requires_grad_(True)
        self.version = version
        self.sha256 = weights_hash(module)
        self.max_batch_size = max_batch_size
        self.accumulator = GradientAccumulator()

    # ---- checks (called on the network side, before anything is queued)

    def check_inputs(self, x: torch.Tensor) -> None:
        spec = self.spec
        if x.dtype != spec.torch_dtype:
            raise InvalidInput(f"{self.uid} takes {spec.dtype} inputs, got {x.dtype}")
        if x.dim() != spec.input_ndim or x.shape[-1] != spec.hidden:
            want = "[batch, hidden]" if spec.input_ndim == 2 else "[batch, seq, hidden]"
            raise InvalidInput(
                f"{self.uid} takes {want} with hidden={spec.hidden}, got {list(x.shape)}"
            )
        if not 1 <= x.shape[0] <= self.max_batch_size:
            raise InvalidInput(f"batch of {x.shape[0]} is outside 1..{self.max_batch_size}")
        if spec.input_ndim == 3 and not 1 <= x.shape[1] <= 8192:
            raise InvalidInput(f"sequence of {x.shape[1]} is outside 1..8192")
        if not torch.isfinite(x).all():
            raise InvalidInput("inputs contain NaN or infinity")

    def check_grad_outputs(self, x: torch.Tensor, grad: torch.Tensor) -> None:
        self.check_inputs(x)
        if grad.shape != x.shape or grad.dtype != x.dtype:
            raise InvalidInput(
                f"grad_outputs {grad.dtype}{list(grad.shape)} must match "
                f"outputs {x.dtype}{list(x.shape)}"
            )
        if not torch.isfinite(grad).all():
            raise InvalidInput("grad_outputs contain NaN or infinity")

    # ---- compute (compute thread)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out: torch.Tensor = self.module(x.to(self.device))
        return out.cpu()

    def backward(self, x: torch.Tensor, grad_outputs: torch.Tensor) -> torch.Tensor:
        """Input gradients for the caller; parameter gradients go to the accumulator.
        Stateless: the forward pass is recomputed from the inputs."""
        x = x.to(self.device).detach().requires_grad_(True)
        with torch.enable_grad():
            out = self.module(x)
            torch.autograd.backward(out, grad_outputs.to(self.device))
        self.accumulator.add(self.module, samples=int(x.shape[0]))
        assert x.grad is not None
        return x.grad.cpu()
