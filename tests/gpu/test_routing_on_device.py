"""A trainer's routing stays on its GPU: the beam search on CUDA chooses what it chooses
on the CPU (and what the per-sample reference chooses), and only the dispatch's indices
come to the host."""

from __future__ import annotations

import torch

from core.moe.beams import LevelAlive, beam_search
from core.moe.dispatch import Dispatch


def test_the_beam_search_on_cuda_chooses_as_on_the_cpu():
    torch.manual_seed(0)
    per_dim = [torch.randn(4096, 64, dtype=torch.bfloat16) for _ in range(2)]
    on_cpu = beam_search(per_dim, 4)
    on_gpu = beam_search([p.cuda() for p in per_dim], 4)
    assert on_gpu.experts.is_cuda
    assert torch.equal(on_gpu.experts.cpu(), on_cpu.experts)
    assert torch.equal(on_gpu.valid.cpu(), on_cpu.valid)


def test_ties_and_partial_liveness_on_cuda_as_on_the_cpu():
    torch.manual_seed(1)
    per_dim = [torch.randint(-2, 3, (512, n)).float() for n in (16, 16)]  # many ties
    prefixes = torch.arange(0, 16, 2)  # only even first coordinates have live experts
    table = torch.rand(8, 16) < 0.5
    levels = [LevelAlive.everything(16), LevelAlive(prefixes, table)]
    on_cpu = beam_search(per_dim, 4, levels)
    gpu_levels = [
        LevelAlive.everything(16, torch.device("cuda")),
        LevelAlive(prefixes.cuda(), table.cuda()),
    ]
    on_gpu = beam_search([p.cuda() for p in per_dim], 4, gpu_levels)
    assert torch.equal(on_gpu.experts.cpu(), on_cpu.experts)
    assert torch.equal(on_gpu.valid.cpu(), on_cpu.valid)
    dispatch = Dispatch.of(on_gpu)  # the indices come to the host for the calls
    assert not dispatch.rows.is_cuda
    assert len(dispatch) == int(on_cpu.valid.sum())
