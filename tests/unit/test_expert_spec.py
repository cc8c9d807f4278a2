"""The expert spec (core/experts/spec.py) names without torch what the registry builds
with it: the same kinds, dtypes (and their sizes) and activations."""

from __future__ import annotations

import pytest

from core.experts.registry import ACTIVATIONS, DTYPES, EXPERT_TYPES, build_expert
from core.experts.spec import (
    ACTIVATION_NAMES,
    DTYPE_BYTES,
    EXPERT_KINDS,
    ExpertSpec,
    SpecError,
)


def test_the_spec_names_what_the_registry_builds():
    assert tuple(EXPERT_TYPES) == EXPERT_KINDS
    assert tuple(ACTIVATIONS) == ACTIVATION_NAMES
    assert tuple(DTYPES) == tuple(DTYPE_BYTES)
    for name, size in DTYPE_BYTES.items():
        assert DTYPES[name].itemsize == size


@pytest.mark.parametrize("dtype", sorted(DTYPE_BYTES))
def test_a_specs_torch_dtype_is_the_one_its_expert_is_built_in(dtype):
    spec = ExpertSpec("swiglu", 8, 16, activation="silu", dtype=dtype)
    assert spec.torch_dtype == DTYPES[dtype]
    assert {p.dtype for p in build_expert(spec).parameters()} == {spec.torch_dtype}


def test_an_unknown_name_is_refused_by_field():
    with pytest.raises(SpecError, match="kind"):
        ExpertSpec("conv", 8)
    with pytest.raises(SpecError, match="dtype"):
        ExpertSpec("ffn", 8, dtype="float64")
    with pytest.raises(SpecError, match="activation"):
        ExpertSpec("ffn", 8, activation="tanh")
