"""bfloat16 projects on the CPU, on every run (tests/gpu repeats the serving checks on
CUDA): answers within the honest bound of the float32 reference, gradients summed in
float32, the manifest's dtype, owners' float32 files rounded at publish."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
import torch

from core.experts import activations
from core.experts.backend import ExpertBackend, compute_dtype
from core.experts.registry import ExpertSpec, build_expert
from core.experts.tolerance import excess, in_float32
from core.experts.uid import ExpertUID
from core.experts.weights import WeightsError, load_weights, save_weights
from core.moe.answer_checks import recompute_rows
from core.project.manifest import ManifestError, parse_manifest

SPEC = ExpertSpec("swiglu", 64, 160, 0, "silu", "bfloat16")
UID = ExpertUID.parse("ffn.0.0")


@pytest.mark.parametrize(
    ("dtype", "device", "expected"),
    [
        (torch.bfloat16, "cpu", torch.float32),  # a CPU's 16-bit products are slow
        (torch.float16, "cpu", torch.float32),
        (torch.float32, "cpu", torch.float32),
        (torch.bfloat16, "cuda", torch.bfloat16),  # tensor cores
        (torch.float32, "cuda", torch.float32),
    ],
)
def test_compute_dtype(dtype, device, expected):
    assert compute_dtype(dtype, torch.device(device)) == expected


def answered(
    served: ExpertBackend,
    reference: torch.nn.Module,
    kind: Literal["forward", "backward"],
    rows: int,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A bfloat16 answer of ``served`` to random rows (outputs, or input gradients of
    small output gradients), and the auditor's recomputation of it with ``reference``."""
    hidden = served.spec.hidden
    x = torch.randn(rows, hidden, generator=gen).to(torch.bfloat16)
    grad = None
    if kind == "forward":
        answer, _ = served.forward(x)
    else:
        grad = (torch.randn(rows, hidden, generator=gen) * 1e-2).to(torch.bfloat16)
        answer = served.input_gradients(x, grad)
    return answer, recompute_rows(reference, kind, x, grad, torch.bfloat16)


@pytest.mark.parametrize("codec", ["raw", "q8"])
def test_cpu_answers_of_a_bfloat16_expert_pass_audits_and_scaled_ones_fail(codec):
    served = ExpertBackend(UID, SPEC, build_expert(SPEC, seed=1), device="cpu")
    reference = build_expert(SPEC, seed=1)
    assert served.sha256 == ExpertBackend(UID, SPEC, build_expert(SPEC, seed=1)).sha256
    gen = torch.Generator().manual_seed(0)
    for i in range(20):
        answer, expected = answered(served, reference, "forward" if i % 2 else "backward", 8, gen)
        assert answer.dtype == torch.bfloat16
        assert expected.dtype == torch.float32  # the exact value of the named computation
        claimed = activations.roundtrip(answer, codec)
        assert excess(claimed, expected, codec, torch.bfloat16) <= 1
        assert excess(claimed * 1.25, expected, codec, torch.bfloat16) > 1


def test_gradients_of_a_bfloat16_expert_are_summed_in_float32_and_kept_as_sent():
    served = ExpertBackend(UID, SPEC, build_expert(SPEC, seed=1), device="cpu")
    x = torch.randn(4, SPEC.hidden).to(torch.bfloat16)
    g = (torch.randn(4, SPEC.hidden) * 1e-2).to(torch.bfloat16)
    _, handle = served.forward(x, keep=True, owner="t")
    assert handle is not None
    grad_x = served.backward_kept("t", handle, g)
    assert grad_x.dtype == torch.bfloat16
    _, again = served.forward(x, keep=True, owner="t")
    assert again is not None
    with pytest.raises(ValueError, match="must match"):
        served.backward_kept("t", again, g.float())  # the project's dtype only
    sums, samples = served.accumulator.take()
    assert samples == 4
    assert all(t.dtype == torch.float32 for t in sums.values())


def test_in_float32_copies_16_bit_modules_only():
    fp32 = build_expert(ExpertSpec("swiglu", 8, 16, 0, "silu", "float32"))
    assert in_float32(fp32) is fp32
    bf16 = build_expert(ExpertSpec("swiglu", 8, 16, 0, "silu", "bfloat16"))
    copy = in_float32(bf16)
    assert copy is not bf16
    assert all(p.dtype == torch.float32 for p in copy.parameters())
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())


def _manifest(**model: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "architecture": "mixtral",
        "vocab_size": 257,
        "hidden": 16,
        "grid": [2, 2],
        "k_best": 2,
        "heads": 2,
        "expert": {"kind": "swiglu", "hidden": 16, "inner": 32},
    }
    fields.update(model)
    return {"project": {"name": "t"}, "model": fields, "weights": {"seed": 0}}


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [(None, "float32"), ("bfloat16", "bfloat16"), ("float16", "float16")],
)
def test_the_manifest_names_the_experts_dtype(dtype, expected):
    extra = {} if dtype is None else {"dtype": dtype}
    m = parse_manifest(_manifest(**extra))
    assert m.model.expert_spec().dtype == expected


def test_an_unknown_dtype_is_a_clear_error():
    with pytest.raises(ManifestError, match=r"model\.dtype"):
        parse_manifest(_manifest(dtype="int8"))


def test_an_owners_float32_file_is_rounded_for_a_bfloat16_project(tmp_path: Path):
    fp32 = ExpertSpec("swiglu", 8, 16, 0, "silu", "float32")
    path = tmp_path / "w.safetensors"
    save_weights(build_expert(fp32, seed=2), path, version=0)
    bf16 = build_expert(ExpertSpec("swiglu", 8, 16, 0, "silu", "bfloat16"))
    with pytest.raises(WeightsError, match=r"expected torch\.bfloat16"):
        load_weights(bf16, path)  # never from a peer: its hash names its own dtype
    load_weights(bf16, path, cast=True)
    want = build_expert(fp32, seed=2).to(torch.bfloat16).state_dict()
    assert all(torch.equal(bf16.state_dict()[k], v) for k, v in want.items())
