"""bfloat16 experts served on CUDA: answers that the CPU's audits accept, gradient
sums in float32, the memory plan that holds, NVML readings, pausing that frees memory."""

from __future__ import annotations

import pytest
import torch

from core.experts import activations
from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert, parameter_count
from core.experts.tolerance import excess
from core.experts.uid import ExpertUID
from core.node.capacity import experts_that_fit, graph_cache_bytes
from core.node.probes.base import Nvml
from tests.unit.test_bf16_experts import answered

SPEC = ExpertSpec("swiglu", 1024, 3584, 0, "silu", "bfloat16")
UID = ExpertUID.parse("ffn.0.0")


def backend(spec: ExpertSpec = SPEC, seed: int = 0, **kw: int) -> ExpertBackend:
    return ExpertBackend(UID, spec, build_expert(spec, seed=seed), device="cuda", **kw)


@pytest.mark.parametrize("blocks", [1, 4])
@pytest.mark.parametrize("codec", ["raw", "q8"])
def test_cuda_answers_pass_the_cpus_audits_and_a_scaled_one_does_not(codec, blocks):
    spec = ExpertSpec("swiglu", 1024, 3584, 0, "silu", "bfloat16", blocks)
    served, reference = backend(spec), build_expert(spec, seed=0)
    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    for i in range(100):
        answer, expected = answered(served, reference, "forward" if i % 2 else "backward", 16, gen)
        assert answer.dtype == torch.bfloat16
        assert answer.device.type == "cpu"
        claimed = activations.roundtrip(answer, codec)
        worst = max(worst, excess(claimed, expected, codec, torch.bfloat16))
        # scaled by 1.25: past the bound wherever |value| > rms(row) / 3, so in every answer
        assert excess(claimed * 1.25, expected, codec, torch.bfloat16) > 1
    assert worst <= 1


def test_gradients_are_summed_in_float32_on_the_device():
    served = backend()
    x = torch.randn(32, SPEC.hidden).to(torch.bfloat16)
    for _ in range(3):
        _, handle = served.forward(x, keep=True, owner="t")
        assert handle is not None
        served.backward_kept("t", handle, x * 1e-2)
    sums, samples = served.accumulator.take()
    assert samples == 96
    assert all(t.dtype == torch.float32 and t.device.type == "cuda" for t in sums.values())
    assert all(p.dtype == torch.bfloat16 for p in served.module.parameters())


def test_the_memory_plan_holds_on_the_device():
    """As many experts as the plan fits in a budget of what is free, each through a
    forward pass with its graph kept, a backward pass, a swap while the graph waits and
    the backward pass on the old weights: torch's peak stays within the budget."""
    free, _total = torch.cuda.mem_get_info()
    budget = int(min(2e9, free / 2))
    params = parameter_count(SPEC)
    n = experts_that_fit(params, 2, budget, None, on_gpu=True)
    assert n >= 2
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    served = [backend(seed=i, graph_cache_bytes=graph_cache_bytes(budget, n)) for i in range(n)]
    # rows whose graph takes what one trainer may hold of an expert's share (half)
    width = SPEC.kept_widths() * SPEC.hidden * 2
    rows = int(graph_cache_bytes(budget, n) // 2 // width) - 1
    x = torch.randn(rows, SPEC.hidden).to(torch.bfloat16)
    for b in served:
        _, handle = b.forward(x, keep=True, owner="t")
        assert handle is not None
        b.backward(x, x)
        b.replace_weights(build_expert(SPEC, seed=99), version=1)
        b.backward_kept("t", handle, x)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak <= budget, f"{peak / 1e9:.2f} GB used of a {budget / 1e9:.2f} GB plan"


def test_nvml_reads_the_gpus_temperature():
    temperature, utilization, power = Nvml().read()
    assert temperature is not None
    assert 5 <= temperature <= 110
    assert utilization is not None
    assert 0 <= utilization <= 1
    assert power is not None
    assert power > 0


def test_pausing_gives_the_gpus_memory_back():
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    served = [backend(seed=i) for i in range(4)]
    x = torch.randn(256, SPEC.hidden).to(torch.bfloat16)
    for b in served:
        _, _handle = b.forward(x, keep=True, owner="t")
        b.backward(x, x)
    held = torch.cuda.memory_reserved() - before
    assert held > 4 * parameter_count(SPEC) * 2
    for b in served:
        b.offload()
    assert torch.cuda.memory_reserved() - before < held / 10
    for b in served:
        b.reload()
        y, _ = b.forward(x)
        assert torch.isfinite(y.float()).all()
    sums, samples = served[0].accumulator.take()
    assert samples == 256
    assert all(t.device.type == "cuda" for t in sums.values())
