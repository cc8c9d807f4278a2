"""Codecs, receipts, contributions, and every reason an aggregator refuses one."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

from core.aggregator.verify import Rejected, VerifyContext, verify
from core.contributing.codecs import CODECS, CodecError, ErrorFeedback, codec
from core.contributing.sender import SenderConfig, close_ahead, contribution_due, next_close
from core.project.versions import pull_interval
from core.protocol.contributions import Contribution, MessageError, ParamSpec, Receipt
from net import Identity

TRAINER = Identity.from_seed(b"t" * 32)
VOLUNTEER = Identity.from_seed(b"v" * 32)
PARAMS = {"w": 6, "b": 3}


@pytest.mark.parametrize("name", sorted(CODECS))
def test_codecs_round_trip_and_check_sizes(name):
    c = codec(name)
    x = torch.randn(2500)
    y = c.decode(c.encode(x), x.numel())
    tolerance = {"fp32": 0, "fp16": 1e-3, "int8_block": 3e-2}[name]
    assert (x - y).norm() / x.norm() <= tolerance
    with pytest.raises(CodecError):
        c.decode(c.encode(x), x.numel() + 1)


def test_error_feedback_sends_what_compression_dropped_later():
    fb, c = ErrorFeedback(), codec("int8_block")
    g = torch.randn(3000) * torch.logspace(-4, 0, 3000)  # small values the codec rounds away
    sent = sum(c.decode(fb.compress("w", g, c), g.numel()) for _ in range(50))
    assert ((sent - 50 * g).norm() / (50 * g).norm()) < 0.01  # the sum is kept, not the error


def make(
    receipts: list[Receipt] | None = None,
    parts: list[torch.Tensor] | None = None,
    **changes: object,
) -> tuple[Contribution, list[torch.Tensor]]:
    if receipts is None:
        receipts = [Receipt.sign(TRAINER, "p1", "ffn0.0.0", 3, [torch.ones(2)], [torch.ones(2)], 8)]
    grads = {"w": torch.randn(6), "b": torch.randn(3)}
    c = codec("fp16")
    if parts is None:
        parts = [part for name in PARAMS for part in c.encode(grads[name])]
    contribution = Contribution.create(
        VOLUNTEER,
        project="p1",
        uid="ffn0.0.0",
        base_version=3,
        codec="fp16",
        params=[ParamSpec(n, k) for n, k in PARAMS.items()],
        receipts=receipts,
        parts=parts,
    )
    if changes:
        contribution = replace(contribution, **changes)  # type: ignore[arg-type]
    return contribution, parts


def ctx(**changes: object) -> VerifyContext:
    base = VerifyContext(
        project="p1",
        params={"ffn0.0.0": PARAMS},
        current_version={"ffn0.0.0": 4},
        staleness_bound=2,
        trainers={TRAINER.public_key},
        seen_nonces=set(),
        seen_batches=set(),
        now=time.time(),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_a_good_contribution_is_accepted_and_survives_the_wire():
    contribution, parts = make()
    again = Contribution.decode(contribution.encode())
    assert again == contribution
    grads = verify(again, parts, ctx())
    assert set(grads) == {"w", "b"}


MALLORY = Identity.generate()


def edited(**changes: object) -> tuple[Contribution, list[torch.Tensor]]:
    contribution, parts = make()
    return replace(contribution, **changes), parts  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "context", "reason"),
    [
        (lambda: make(signature=bytes(64)), {}, "bad_signature"),
        # edited after signing: its claim no longer adds up, which is checked before any
        # signature (claims are cheap; a stranger's junk costs no signature check)
        (lambda: edited(samples=80), {}, "inflated_samples"),
        (lambda: edited(timestamp=int(time.time()) + 1), {}, "bad_signature"),
        (
            lambda: make(receipts=[Receipt.sign(MALLORY, "p1", "ffn0.0.0", 3, [], [], 8)]),
            {},
            "foreign_receipt",
        ),
        (
            lambda: make(receipts=[Receipt.sign(TRAINER, "p1", "ffn0.0.9", 3, [], [], 8)]),
            {},
            "foreign_receipt",
        ),
        (
            lambda: make(
                receipts=[
                    replace(Receipt.sign(TRAINER, "p1", "ffn0.0.0", 3, [], [], 8), samples=800)
                ]
            ),
            {},
            "foreign_receipt",
        ),
        (lambda: make(), {"seen_nonces": "nonce"}, "replay"),
        (lambda: make(), {"current_version": {"ffn0.0.0": 9}}, "stale"),
        (lambda: make(), {"current_version": {"ffn0.0.0": 1}}, "future_version"),
        (
            lambda: (
                make()[0],
                [torch.zeros(6, dtype=torch.float16), torch.zeros(3, dtype=torch.float16)],
            ),
            {},
            "payload_mismatch",
        ),
        (
            lambda: make(
                parts=[torch.zeros(7, dtype=torch.float16), torch.zeros(3, dtype=torch.float16)]
            ),
            {},
            "shape",
        ),
        (lambda: make(), {"params": {"ffn0.0.0": {"w": 7, "b": 3}}}, "shape"),
        (
            lambda: make(
                parts=[
                    torch.full((6,), float("nan"), dtype=torch.float16),
                    torch.zeros(3, dtype=torch.float16),
                ]
            ),
            {},
            "non_finite",
        ),
        (lambda: make(), {"trainers": set()}, "foreign_receipt"),
        (lambda: make(), {"project": "p2"}, "wrong_project"),
        (lambda: make(), {"now": time.time() + 7200}, "clock"),
    ],
)
def test_each_bad_contribution_is_refused_with_its_reason(build, context, reason):
    contribution, parts = build()
    if context.get("seen_nonces") == "nonce":
        context = {"seen_nonces": {contribution.nonce}}
    with pytest.raises(Rejected) as info:
        verify(contribution, parts, ctx(**context))
    assert info.value.reason == reason


def test_inflated_sample_count_is_refused():
    receipts = [Receipt.sign(TRAINER, "p1", "ffn0.0.0", 3, [], [], 8)]
    honest, parts = make(receipts=receipts)
    # a volunteer signing its own (inflated) claim: the signature is fine, the sum is not
    unsigned = replace(honest, samples=8000, signature=b"")
    from net.codec import pack

    inflated = replace(unsigned, signature=VOLUNTEER.sign(pack(unsigned.signed_fields())))
    with pytest.raises(Rejected) as info:
        verify(inflated, parts, ctx())
    assert info.value.reason == "inflated_samples"


def test_a_receipt_counted_before_is_refused():
    receipt = Receipt.sign(TRAINER, "p1", "ffn0.0.0", 3, [], [], 8)
    contribution, parts = make(receipts=[receipt])
    with pytest.raises(Rejected, match="receipt_reused"):
        verify(contribution, parts, ctx(seen_batches={receipt.batch_id}))
    twice, parts = make(receipts=[receipt, receipt])
    with pytest.raises(Rejected, match="receipt_reused"):
        verify(twice, parts, ctx())


@pytest.mark.parametrize("data", [b"", b"\x93\x01\x02\x03", b"\xc1" * 10, bytes(100)])
def test_garbage_headers_are_malformed_not_crashes(data):
    with pytest.raises(MessageError):
        Contribution.decode(data)


def test_an_oversized_contribution_header_is_refused_before_decoding():
    from core.protocol.contributions import MAX_HEADER_BYTES

    with pytest.raises(MessageError, match="too large"):
        Contribution.decode(b"\x90" * (MAX_HEADER_BYTES + 1))


@pytest.mark.parametrize(
    ("samples", "seconds", "to_close", "due"),
    [
        (0, 0.0, None, False),  # nothing to send
        (0, 3600.0, None, False),  # nothing to send, however long it has been
        (511, 29.9, None, False),  # neither enough samples nor old enough
        (512, 0.0, None, True),  # enough samples
        (1, 30.0, None, True),  # a few samples, and the last send is old enough
        (10_000, 0.0, None, True),
        # the expert's round closes within a delivery's time: what is in joins it
        (1, 5.0, 0.0, True),
        (1, 5.0, -0.5, True),
        (1, 5.0, 0.1, False),  # not yet
        (0, 5.0, -0.5, False),  # nothing to send
        # when the close is known, it replaces the regular time (one send a round)...
        (1, 30.0, 5.0, False),
        # ...but not the bound on samples
        (512, 0.0, 5.0, True),
    ],
)
def test_when_a_contribution_is_due(samples, seconds, to_close, due):
    config = SenderConfig(project="p1", every_samples=512, every_seconds=30.0)
    assert contribution_due(samples, seconds, config, to_close) is due


@pytest.mark.parametrize(
    ("told", "served", "now", "close"),
    [
        (100.0, None, 90.0, 100.0),  # as the aggregator said
        (100.0, None, 100.0, 100.0),
        (100.0, None, 101.0, 160.0),  # passed: the beat's next round (60 s)
        (100.0, None, 250.0, 280.0),  # several passed unheard of
        (100.0, 100.0, 99.0, 160.0),  # sent for already: the next
        (100.5, 100.0, 99.5, 160.5),  # told again, the same round (a reply's rounding)
        (160.0, 100.0, 130.0, 160.0),  # a round after the one sent for
    ],
)
def test_when_the_round_closes_next(told, served, now, close):
    assert next_close(told, served, now, 60.0) == close


@pytest.mark.parametrize(
    ("told", "served", "now", "lead", "ahead"),
    [
        (None, None, 90.0, 2.0, None),  # not told (an older aggregator)
        (100.0, None, 90.0, 2.0, (100.0, 8.0)),
        (100.0, None, 98.5, 2.0, (100.0, -0.5)),  # due
        (100.0, 100.0, 98.5, 2.0, (160.0, 59.5)),  # served: the next
        # a delivery takes half a round or more: a send before each close would be a
        # send all the time (big experts behind slow uplinks): the regular schedule
        (100.0, None, 90.0, 30.0, None),
        (100.0, None, 90.0, 29.0, (100.0, -19.0)),
    ],
)
def test_how_far_ahead_the_close_is(told, served, now, lead, ahead):
    assert close_ahead(told, served, now, lead, 60.0) == ahead


@pytest.mark.parametrize(
    ("round_seconds", "interval"),
    [
        (60.0, 10.0),  # the manifest's default round: every 10 s, as before
        (20.0, 10.0),
        (8.0, 4.0),  # the demo's: twice a round
        (2.0, 1.0),
        (0.5, 1.0),  # never more often than every second
    ],
)
def test_volunteers_look_for_new_versions_twice_a_round(round_seconds, interval):
    assert pull_interval(round_seconds) == interval
