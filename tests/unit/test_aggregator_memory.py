"""An aggregator's memory per parameter and what its rounds write: compact state at rest
(bfloat16 moments and center rounded at random, Q8 momenta), no gradients in memory
(read back from the journal), past versions on disk, files per expert, statistics and
bans that outlive a restart, journal segments that go once settled."""

from __future__ import annotations

import pytest
import torch

from core.aggregator.compact import Q8, round_stochastic
from core.aggregator.optimizer import CompactAdam
from core.checkpoints import CheckpointStore, optimizer_state
from core.experts.registry import ExpertSpec
from net import Identity
from tests.unit import test_aggregator_core
from tests.unit.test_aggregator_core import UID, contribution, make_core, settings

BF16_SPEC = ExpertSpec("ffn", hidden=4, inner=8, dtype="bfloat16")


@pytest.fixture(autouse=True)
def _close_cores():
    yield
    while test_aggregator_core._open:
        test_aggregator_core._open.pop().close()


@pytest.mark.parametrize(
    ("rounding", "expected_end"),
    [
        # to nearest, the average stops where one step's change is under half an ulp
        ("nearest", 1.0),
        # at random, it moves on average as in float32
        ("stochastic", 2 - 0.999**2000),
    ],
)
def test_a_bfloat16_running_average_moves_only_when_rounded_at_random(rounding, expected_end):
    generator = torch.Generator().manual_seed(0)
    average = torch.ones(20_000, dtype=torch.bfloat16)
    for _ in range(2000):
        updated = average.float() * 0.999 + 0.001 * 2.0
        if rounding == "nearest":
            average = updated.to(torch.bfloat16)
        else:
            average = round_stochastic(updated, torch.bfloat16, generator)
    assert average.float().mean().item() == pytest.approx(expected_end, rel=2e-3)


def test_stochastic_rounding_is_unbiased_and_keeps_infinities():
    generator = torch.Generator().manual_seed(1)
    x = torch.full((100_000,), 1.0 + 1 / 512)  # a quarter of the way from 1 to 1.0078125
    rounded = round_stochastic(x, torch.bfloat16, generator).float()
    assert set(torch.unique(rounded).tolist()) == {1.0, 1.0078125}
    assert rounded.mean().item() == pytest.approx(1.0 + 1 / 512, rel=1e-4)
    special = torch.tensor([float("inf"), float("-inf")])
    assert torch.equal(round_stochastic(special, torch.bfloat16, generator).float(), special)


def test_q8_blocks_are_within_a_step_and_unbiased():
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(10_000) * torch.linspace(0.01, 10, 10_000)
    q = Q8.encode(x, generator)
    assert q.nbytes == 10_000 + 4 * 40  # blocks of 256
    step = q.scales.repeat_interleave(256)[:10_000]
    assert bool(((q.decode() - x).abs() <= step * 1.0001).all())
    mean = sum(Q8.encode(x, generator).decode() for _ in range(200)) / 200
    assert bool(((mean - x).abs() <= step * 0.25).all())


@pytest.mark.parametrize(("decoupled", "decay"), [(False, 0.0), (False, 0.1), (True, 0.1)])
def test_compact_adam_with_float32_moments_is_torchs(decoupled, decay):
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    b.load_state_dict(a.state_dict())
    reference = (torch.optim.AdamW if decoupled else torch.optim.Adam)(
        a.parameters(), lr=1e-2, weight_decay=decay
    )
    compact = CompactAdam(b.parameters(), 1e-2, weight_decay=decay, decoupled=decoupled)
    for _ in range(20):
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        reference.step()
        compact.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_compact_adam_with_bfloat16_moments_follows_float32_adam():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
    b.load_state_dict(a.state_dict())
    start = [p.detach().clone() for p in a.parameters()]
    reference = torch.optim.Adam(a.parameters(), lr=1e-3)
    compact = CompactAdam(b.parameters(), 1e-3, moments=torch.bfloat16)
    for _ in range(200):
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            p.grad = torch.randn_like(p) + 0.5
            q.grad = p.grad.clone()
        reference.step()
        compact.step()
    assert all(s["exp_avg_sq"].dtype == torch.bfloat16 for s in compact.state.values())
    for p, q, p0 in zip(a.parameters(), b.parameters(), start, strict=True):
        moved = (p - p0).norm()
        assert (p - q).norm() < 0.02 * moved


def bf16_settings(**changes: object):
    return settings(spec=BF16_SPEC, optimizer="adam", contribution_audit_rate=0.5, **changes)


def test_a_16_bit_project_keeps_its_state_compact_and_its_past_versions_on_disk(tmp_path):
    core = make_core(bf16_settings(staleness_bound=2), tmp_path)
    published = []
    for version in range(5):
        published.append(core.published_state(UID))
        for i in range(3):
            core.submit(*contribution(core, Identity.from_seed(bytes([i]) * 32), 1.0 + i, version))
        assert all(not hasattr(p, "grads") for p in core.pending[UID])  # no gradient held
        core.run_round(UID)
    state = core.robust[UID]
    assert state.previous is not None
    assert state.previous.dtype == torch.bfloat16
    assert state.momenta
    assert all(isinstance(m, Q8) for m in state.momenta.values())
    optimizer = core.optimizers[UID]
    assert all(s["exp_avg"].dtype == torch.bfloat16 for s in optimizer.state.values())
    assert all(p.dtype == torch.float32 for p in core.modules[UID].parameters())
    # the last staleness_bound + 1 versions, as they were published, from disk
    assert core.files.kept_versions(UID) == [2, 3, 4]
    for version in (2, 3, 4):
        kept = core.weights_of(UID, version)
        assert kept is not None
        assert all(torch.equal(kept[k], published[version][k]) for k in kept)
    assert core.weights_of(UID, 1) is None
    core.close()

    again = make_core(bf16_settings(staleness_bound=2), tmp_path)
    assert again.versions[UID] == 5
    for k, v in again.modules[UID].state_dict().items():
        assert torch.equal(v, core.modules[UID].state_dict()[k])
    momenta = again.robust[UID].momenta
    assert momenta is not None
    assert state.momenta is not None
    for who, m in momenta.items():
        before = state.momenta[who]
        assert isinstance(m, Q8)
        assert isinstance(before, Q8)
        assert torch.equal(m.decode(), before.decode())


def test_statistics_and_bans_outlive_a_restart(tmp_path):
    core = make_core(settings(max_invalid=2, round_samples=8), tmp_path)
    honest = Identity.from_seed(b"h" * 32)
    core.submit(*contribution(core, honest))
    mallory = Identity.from_seed(b"m" * 32)
    for _ in range(2):
        msg, parts = contribution(core, mallory)
        with pytest.raises(Exception, match="payload_mismatch"):
            core.submit(msg, [p * 2 for p in parts])
    core.run_round(UID)
    core.submit(*contribution(core, honest, version=1))  # accepted after the last save
    before = core.stats.contributors[honest.public_key.hex()].report()
    core.close()

    again = make_core(settings(max_invalid=2, round_samples=8), tmp_path)
    after = again.stats.contributors[honest.public_key.hex()].report()
    assert after == before
    assert after.accepted == 2
    assert after.rounds == 1
    assert after.samples > 0
    assert again.stats.rejected["payload_mismatch"] == 2
    with pytest.raises(Exception, match="banned"):
        again.submit(*contribution(again, mallory, version=1))


def test_journal_segments_go_once_everything_in_them_is_applied(tmp_path):
    core = make_core(settings(round_samples=8), tmp_path)
    core._journal.segment_bytes = 1  # a segment per record
    for version in range(3):
        for i in range(2):
            core.submit(*contribution(core, Identity.from_seed(bytes([i]) * 32), 1.0, version))
        core.run_round(UID)
    # only the segment being written is left: nothing older waits
    assert core._journal.segments() == [core._journal.current]
    core.submit(*contribution(core, Identity.from_seed(b"x" * 32), 1.0, 3))
    waiting = core.pending[UID][0].where.segment
    core.close()
    again = make_core(settings(round_samples=8), tmp_path)
    assert [p.where.segment for p in again.pending[UID]] == [waiting]
    again.run_round(UID)
    assert again.versions[UID] == 4


def test_an_aggregator_of_the_single_checkpoint_layout_starts_from_it(tmp_path):
    """Before files per expert, one checkpoint held everything (torch's Adam): a new
    aggregator starts from it, then keeps files per expert."""
    old = make_core(settings(optimizer="adam"), tmp_path / "made")
    old.submit(*contribution(old, Identity.generate()))
    old.run_round(UID)
    module = old.modules[UID]
    adam = torch.optim.Adam(module.parameters())
    for p in module.parameters():
        adam.state[p] = {
            "step": torch.tensor(1.0),
            "exp_avg": torch.full_like(p, 0.5),
            "exp_avg_sq": torch.full_like(p, 0.25),
        }
    tensors = {f"w/{UID}/{n}": t.clone() for n, t in module.state_dict().items()}
    opt_meta = optimizer_state(adam, f"o/{UID}", tensors)
    state = {
        "versions": {UID: 7},
        "applied": [],
        "seen_nonces": [b"n" * 32],
        "seen_batches": [],
        "robust": {UID: {"rounds": 1, "last_seen": {}, "scale": None}},
        "optimizers": {UID: opt_meta},
    }
    CheckpointStore(tmp_path / "legacy" / "checkpoints").save(3, state, tensors)
    core = make_core(settings(optimizer="adam"), tmp_path / "legacy")
    assert core.versions[UID] == 7
    assert b"n" * 32 in core.seen.nonces
    for k, v in core.modules[UID].state_dict().items():
        assert torch.equal(v, module.state_dict()[k])
    slots = list(core.optimizers[UID].state.values())
    assert slots
    assert all(s["step"] == 1 for s in slots)
    assert all(torch.equal(s["exp_avg"], torch.full_like(s["exp_avg"], 0.5)) for s in slots)
    assert not (tmp_path / "legacy" / "checkpoints").exists()
    assert (tmp_path / "legacy" / "experts" / f"{UID}.safetensors").exists()


_HEAP_PROBE = """
import ctypes
from pathlib import Path

from core.aggregator.heap import release_free_memory


def rss():
    lines = Path("/proc/self/status").read_text().splitlines()
    line = next(x for x in lines if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD: 16 MB blocks from the heap, as after rounds
blocks = []
for _ in range(24):
    block = libc.malloc(16 << 20)
    ctypes.memset(block, 1, 16 << 20)  # touched: resident
    blocks.append(block)
keep = libc.malloc(1 << 20)  # above them: the heap's top cannot shrink past it
ctypes.memset(keep, 1, 1 << 20)
for block in blocks:
    libc.free(block)
before = rss()
assert release_free_memory() is True
print(before - rss())
"""


def test_freed_heap_memory_goes_back_to_the_system_after_a_round():
    """glibc keeps a round's freed transients in its heap (9 bytes per parameter of a
    64-expert aggregator's 23 were free heap): the round gives them back. In a child
    process: the probe changes the allocator's settings."""
    import subprocess
    import sys

    from core.aggregator.heap import release_free_memory

    if not sys.platform.startswith("linux"):
        assert release_free_memory() is False
        return
    out = subprocess.run(
        [sys.executable, "-c", _HEAP_PROBE], capture_output=True, text=True, check=True
    )
    assert int(out.stdout) > 200 << 20  # most of the 384 MB freed
