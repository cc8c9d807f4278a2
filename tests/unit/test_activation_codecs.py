"""Activation codecs: what each keeps, what it costs on the wire, and what it refuses."""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from core.experts import activations
from core.experts.activations import (
    ACTIVATION_CODECS,
    ActivationCodecError,
    WireCodecs,
    decode,
    encode,
    roundtrip,
)
from net import Tensor

QUANTIZED = {"q8": 8, "q4": 4, "q3": 3, "q4z": 4}


def _x(*shape: int, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("name", ACTIVATION_CODECS)
@pytest.mark.parametrize("shape", [(256, 64), (3, 5), (0, 64), (2, 7, 130), (1, 1), (2, 0, 64)])
def test_every_codec_gives_back_the_shape_and_dtype_asked_for(name, shape):
    x = _x(*shape)
    y = decode(encode(x, name), name, width=shape[-1], dtype=torch.float32)
    assert y.shape == x.shape
    assert y.dtype == torch.float32


@pytest.mark.parametrize(
    ("name", "bytes_per_value", "relative_error"),
    [
        # (bytes on the wire per value of a [256, 64] tensor, relative error bound on
        # a Gaussian tensor)
        ("raw", 4.0, 0.0),
        ("f16", 2.0, 1e-3),
        ("bf16", 2.0, 1e-2),
        ("q8", 1 + 2 / 64, 0.01),
        ("q4", 0.5 + 2 / 64, 0.13),
        ("q3", 3 / 8 + 2 / 64, 0.3),
    ],
)
def test_what_each_codec_costs_and_keeps(name, bytes_per_value, relative_error):
    # (q4z: below)
    x = _x(256, 64)
    parts = encode(x, name)
    assert activations.wire_bytes(parts) == pytest.approx(bytes_per_value * x.numel())
    error = float((roundtrip(x, name) - x).norm() / x.norm())
    assert error <= relative_error


@pytest.mark.parametrize(("name", "bits"), QUANTIZED.items())
def test_a_quantized_value_is_off_by_at_most_half_a_step_of_its_block(name, bits):
    # blocks of very different magnitudes: each keeps its own scale
    x = torch.cat([_x(8, 64, scale=1e-6), _x(8, 64, scale=1e3, seed=1)], dim=1)
    y = roundtrip(x, name)
    levels = 2 ** (bits - 1) - 1
    for block in range(2):
        cols = slice(64 * block, 64 * (block + 1))
        absmax = x[:, cols].abs().amax(dim=1, keepdim=True)
        # half a step, and the scale's own bfloat16 rounding (8 bits of mantissa)
        bound = absmax / levels * (0.5 + levels * 2**-8) + 1e-30
        assert ((y[:, cols] - x[:, cols]).abs() <= bound).all()


def test_gradients_far_below_float16s_range_survive_bf16_and_quantization():
    g = _x(16, 64, scale=1e-9)
    assert roundtrip(g, "f16").abs().max() < 1e-7  # float16 flushes them (the reason for bf16)
    for name in ("bf16", "q8", "q4"):
        assert float((roundtrip(g, name) - g).norm() / g.norm()) < 0.15, name


def test_zeros_stay_zeros_and_encoding_is_deterministic():
    assert roundtrip(torch.zeros(4, 64), "q3").abs().max() == 0
    x = _x(33, 70)
    for name in ACTIVATION_CODECS:
        a, b = encode(x, name), encode(x.clone(), name)
        assert [bytes(p.data) for p in a] == [bytes(p.data) for p in b]


def _scales(*values: float) -> Tensor:
    """A scales part for two rows of one block each."""
    data = torch.tensor(values).to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
    return Tensor("bfloat16", (len(values), 1), data)


def _q4_parts(rows: int = 2, width: int = 64) -> list[Tensor]:
    return encode(_x(rows, width), "q4")


@pytest.mark.parametrize(
    ("parts", "name", "words"),
    [
        (_q4_parts()[:1], "q4", "2 part"),
        (_q4_parts()[::-1], "q4", "uint8 codes"),
        (_q4_parts(width=72), "q4", "do not fit"),
        ([_q4_parts()[0], encode(_x(3, 64), "q4")[1]], "q4", "do not fit"),
        ([_q4_parts()[0], _scales(-1.0, 1.0)], "q4", "non-negative"),
        ([_q4_parts()[0], _scales(math.inf, 1.0)], "q4", "finite"),
        (encode(_x(2, 64), "f16"), "bf16", "bfloat16"),
        (_q4_parts(), "q5", "unknown activation codec"),
    ],
)
def test_parts_that_do_not_decode_are_refused_in_words(parts, name, words):
    with pytest.raises(ActivationCodecError, match=words):
        decode(parts, name, width=64, dtype=torch.float32)


def test_a_project_names_only_known_codecs():
    assert WireCodecs("q4", "q3").gradients == "q3"
    with pytest.raises(ActivationCodecError, match="unknown"):
        WireCodecs("q2")


@pytest.mark.parametrize(("name", "bits"), QUANTIZED.items())
def test_gradients_rounded_at_random_are_right_on_average(name, bits):
    torch.manual_seed(0)
    g = _x(1, 64)
    draws = torch.stack([roundtrip(g, name, stochastic=True) for _ in range(4000)])
    step = float(g.abs().max()) / (2 ** (bits - 1) - 1)
    # nearest rounding is off by up to half a step, always the same way; at random, the
    # mean of 4000 draws is within 0.05 step (6 standard deviations)
    assert float((draws.mean(dim=0) - g).abs().max()) < 0.05 * step
    assert float((roundtrip(g, name) - g).abs().max()) > 0.1 * step  # the contrast


def test_q4z_is_q4_deflated_below_an_eighth_of_float32():
    x = _x(2048, 64)
    parts = encode(x, "q4z")
    assert torch.equal(roundtrip(x, "q4z"), roundtrip(x, "q4"))
    # bell-shaped blocks: the codes deflate from 4 bits to ~3.55 (scales: 0.25 bits)
    assert activations.wire_bytes(parts) < x.numel() * 4 / 8
    assert parts[0].shape == (2048, 1)  # scales first: the rows are read from it


def _deflated(data: bytes) -> Tensor:
    return Tensor("uint8", (len(data),), data)


@pytest.mark.parametrize(
    ("tamper", "words"),
    [
        # a bomb: a megabyte of zeros where 64 bytes are due; inflating stops at 64
        (lambda s, d: [s, _deflated(zlib.compress(bytes(1 << 20)))], "are not"),
        (lambda s, d: [s, _deflated(bytes(d.data)[:-5])], "are not|inflate"),
        (lambda s, d: [s, _deflated(bytes(d.data) + b"junk")], "are not"),
        (lambda s, d: [s, _deflated(b"not deflate at all")], "do not inflate"),
        (lambda s, d: [d, s], "bfloat16 scales"),
        (lambda s, d: [_scales(-1.0, 1.0), d], "non-negative"),
    ],
)
def test_q4z_parts_that_do_not_inflate_to_their_size_are_refused(tamper, words):
    scales, deflated = encode(_x(2, 64), "q4z")
    with pytest.raises(ActivationCodecError, match=words):
        decode(tamper(scales, deflated), "q4z", width=64, dtype=torch.float32)
