"""Experts without the network: specs, uids, weights files, batching, kept graphs."""

from __future__ import annotations

import time
from functools import partial

import pytest
import torch
import trio
import trio.testing

from core.experts.backend import CacheMiss, ExpertBackend, GraphCache
from core.experts.batching import STRANGER, TRAINER, FairQueue, QueueFull, TaskPool
from core.experts.records import ExpertAnnouncement, PrefixAnnouncement, prefix_children
from core.experts.registry import ExpertSpec, SpecError, build_expert
from core.experts.uid import ExpertUID, Grid, UIDError
from core.experts.weights import WeightsError, load_weights, save_weights, weights_hash
from net import RecordRejected


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"kind": "ffn", "hidden": 8}, None),
        ({"kind": "swiglu", "hidden": 8, "inner": 16, "activation": "silu"}, None),
        ({"kind": "ffn", "hidden": 8, "heads": 0}, None),  # reserved, as to_dict sends it
        ({"kind": "transformer", "hidden": 8, "heads": 2}, "kind"),  # removed (issue 38)
        ({"kind": "lstm", "hidden": 8}, "kind"),
        ({"kind": "ffn", "hidden": 0}, "hidden"),
        ({"kind": "ffn", "hidden": "8"}, "hidden"),
        ({"kind": "ffn", "hidden": 8, "activation": "eval"}, "activation"),
        ({"kind": "ffn", "hidden": 8, "dtype": "float64"}, "dtype"),
        ({"kind": "ffn", "hidden": 8, "heads": 2}, "heads"),
        ({"kind": "swiglu", "hidden": 8, "heads": 0.0}, "heads"),
        ({"kind": "ffn", "hidden": 8, "code": "import os"}, "code"),
        ({"hidden": 8}, "kind"),
    ],
)
def test_expert_specs_are_data_and_errors_name_the_field(data, error):
    if error is None:
        spec = ExpertSpec.from_dict(data)
        assert ExpertSpec.from_dict(spec.to_dict()) == spec
    else:
        with pytest.raises(SpecError, match=error):
            ExpertSpec.from_dict(data)


def test_the_transformer_kind_is_refused_naming_kind():
    """Issue 38: the transformer expert kind was removed; a spec naming it (from a peer
    or an old manifest) is refused, and the error names the field."""
    with pytest.raises(SpecError, match=r"^kind: 'transformer' is not one of \['ffn', 'swiglu'\]"):
        ExpertSpec(kind="transformer", hidden=16, inner=32)


def kept_bytes(module: torch.nn.Module, x: torch.Tensor) -> int:
    """What a kept graph of ``module`` on ``x`` holds: the tensors autograd saves for the
    backward pass (not the weights) and the output the cache keeps."""
    weights = {p.data_ptr() for p in module.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in weights:
            saved[t.data_ptr()] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
    return sum(saved.values()) + out.numel() * out.element_size()


@pytest.mark.parametrize(
    "spec", [ExpertSpec("ffn", 16, 32), ExpertSpec("swiglu", 16, 64, activation="silu")]
)
def test_a_kept_graph_estimate_covers_what_autograd_keeps(spec):
    """The kept-graph cache is bounded by ``_graph_bytes``: it must not undercount the
    activations autograd saves for a backward pass (nor wildly overcount them)."""
    module = build_expert(spec, seed=1)
    x = torch.randn(8, spec.hidden).requires_grad_(True)
    kept = kept_bytes(module, x)
    estimate = ExpertBackend(ExpertUID.parse("ffn.0"), spec, module)._graph_bytes(x)
    assert kept <= estimate <= 2 * kept


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("ffn.3.17", True),
        ("ffn.0", True),
        ("att_x-1.2.3.4", True),
        ("ffn", False),
        ("ffn.", False),
        ("Ffn.1", False),
        ("ffn.1.x", False),
        ("ffn.1.2.3.4.5", False),
        ("ffn.1234567", False),
    ],
)
def test_uid_parsing(text, ok):
    if ok:
        assert str(ExpertUID.parse(text)) == text
    else:
        with pytest.raises(UIDError):
            ExpertUID.parse(text)


def test_uid_prefixes_and_grid():
    assert ExpertUID.parse("ffn.3.17").prefixes() == ["ffn.", "ffn.3."]
    grid = Grid("ffn", (2, 3))
    assert len(grid) == 6
    assert ExpertUID.parse("ffn.1.2") in grid
    assert ExpertUID.parse("ffn.2.0") not in grid
    assert [str(u) for u in grid][:2] == ["ffn.0.0", "ffn.0.1"]
    assert prefix_children(["ffn.1.2", "ffn.1.0", "ffn.0.5"]) == {
        "ffn.": {0, 1},
        "ffn.1.": {0, 2},
        "ffn.0.": {5},
    }


def test_weights_round_trip_hash_and_refusals(tmp_path):
    spec = ExpertSpec("ffn", 8, 16)
    a, b = build_expert(spec, seed=1), build_expert(spec, seed=2)
    assert weights_hash(a) == weights_hash(build_expert(spec, seed=1))  # deterministic
    assert weights_hash(a) != weights_hash(b)
    info = save_weights(a, tmp_path / "a.safetensors", version=7)
    loaded = load_weights(b, tmp_path / "a.safetensors")
    assert loaded == info
    assert weights_hash(b) == info.sha256
    with pytest.raises(WeightsError, match="does not match"):
        load_weights(b, tmp_path / "a.safetensors", expected_sha256="0" * 64)
    with pytest.raises(WeightsError, match="do not match the expert"):
        load_weights(
            build_expert(ExpertSpec("swiglu", 8, 16, activation="silu")), tmp_path / "a.safetensors"
        )
    with pytest.raises(WeightsError, match=r"fc1\.\w+ is torch.float32\[16"):
        load_weights(build_expert(ExpertSpec("ffn", 8, 32)), tmp_path / "a.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(WeightsError, match="cannot read"):
        load_weights(b, tmp_path / "bad.safetensors")


@pytest.mark.parametrize(
    "value",
    [
        b"garbage",
        ExpertAnnouncement("ffn.0.0", "dancing", 0, "x", 0.0, 1).encode(),
        PrefixAnnouncement((-1,)).encode(),
    ],
)
def test_expert_record_schema_refuses_nonsense(value):
    with pytest.raises(RecordRejected):
        ExpertAnnouncement.decode(value) if b"next" not in value else PrefixAnnouncement.decode(
            value
        )


def test_graph_cache_bounds():
    cache = GraphCache(max_bytes=100, max_entries=2, ttl=60)
    t = torch.zeros(1)
    h1 = cache.put("me", t, t, 40)
    h2 = cache.put("me", t, t, 40)
    h3 = cache.put("me", t, t, 40)  # evicts h1 (bytes and entries)
    assert h1 is not None
    assert h2 is not None
    assert h3 is not None
    assert cache.put("me", t, t, 1000) is None  # never fits
    with pytest.raises(CacheMiss):
        cache.pop("me", h1)
    with pytest.raises(CacheMiss):
        cache.pop("you", h2)  # not the owner's
    cache.pop("me", h3)
    with pytest.raises(CacheMiss):
        cache.pop("me", h3)  # used once


async def test_concurrent_requests_are_batched_and_split_back():
    calls: list[int] = []

    def process(inputs, keep, owner, extras):
        calls.append(inputs[0].shape[0])
        time.sleep(0.05)
        return inputs[0] * 2, None, 0

    pool = TaskPool("t", process, trio.CapacityLimiter(1), max_batch_size=64)
    results: dict[int, torch.Tensor] = {}

    async def one(i):
        results[i], _, _ = await pool.submit(torch.full((i + 1, 2), float(i)))

    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        async with trio.open_nursery() as inner:
            for i in range(6):
                inner.start_soon(one, i)
        nursery.cancel_scope.cancel()
    for i in range(6):
        assert torch.equal(results[i], torch.full((i + 1, 2), 2.0 * i))
    assert len(calls) < 6  # requests queued while a batch computed ran together
    assert sum(calls) == sum(range(1, 7))
    assert pool.stats.largest_batch > 1


async def test_a_batch_never_exceeds_the_limit():
    sizes: list[int] = []

    def process(inputs, keep, owner, extras):
        sizes.append(inputs[0].shape[0])
        return inputs[0], None, 0

    pool = TaskPool("t", process, trio.CapacityLimiter(1), max_batch_size=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        async with trio.open_nursery() as inner:
            for i, n in enumerate((6, 6, 3, 10)):
                inner.start_soon(partial(pool.submit, torch.zeros(n, 1), owner=i))
        nursery.cancel_scope.cancel()
    assert max(sizes) <= 10
    assert sum(sizes) == 25


def test_backend_backward_matches_kept_graph_backward():
    spec = ExpertSpec("ffn", 8, 16)
    backend = ExpertBackend(ExpertUID.parse("ffn.0.0"), spec, build_expert(spec, seed=3))
    x, g = torch.randn(5, 8), torch.randn(5, 8)
    y, handle = backend.forward(x, keep=True, owner="me")
    assert handle is not None
    torch.testing.assert_close(y, backend.forward(x)[0])
    gx_kept = backend.backward_kept("me", handle, g)
    kept_sums, _ = backend.accumulator.take()
    gx = backend.backward(x, g)
    sums, samples = backend.accumulator.take()
    torch.testing.assert_close(gx_kept, gx)
    for name in sums:
        torch.testing.assert_close(kept_sums[name], sums[name])
    assert samples == 5


def test_a_graph_kept_across_a_swap_of_weights_backpropagates_on_the_old_weights():
    """A trainer's batch in flight while new weights come in: its backward pass still
    gets input gradients, and the parameter gradients go to the old version's
    accumulator (contributed for that version), not the new one's."""
    spec = ExpertSpec("ffn", 8, 16)
    old, new = build_expert(spec, seed=3), build_expert(spec, seed=4)
    reference = ExpertBackend(ExpertUID.parse("ffn.0.0"), spec, build_expert(spec, seed=3))
    backend = ExpertBackend(ExpertUID.parse("ffn.0.0"), spec, old, version=7)
    x, g = torch.randn(5, 8), torch.randn(5, 8)
    _, before = backend.forward(x, keep=True, owner="me")
    backend.replace_weights(new, 8)
    _, after = backend.forward(x, keep=True, owner="me")
    assert before is not None
    assert after is not None
    assert before != after
    assert backend.kept_version("me", before) == 7
    assert backend.kept_version("me", after) == 8
    assert backend.kept_version("someone else", before) is None
    receipt = type("Receipt", (), {"version": 7})()
    gx = backend.backward_kept("me", before, g, receipts=[receipt])
    torch.testing.assert_close(gx, reference.backward(x, g))
    (old_module, old_acc), (new_module, new_acc) = backend.accumulators()
    assert old_module is old
    assert new_module is backend.module
    assert old_acc.samples == 5
    assert old_acc.receipts == [receipt]
    assert new_acc.samples == 0
    ref_sums, _ = reference.accumulator.take()
    for name, total in old_acc.take()[0].items():
        torch.testing.assert_close(total, ref_sums[name])
    # a second swap drops version 7, whose graphs are all used (its gradients were
    # sent before the swap), and keeps version 8, which still holds one
    backend.replace_weights(build_expert(spec, seed=5), 9)
    assert [w.version for w in backend.previous] == [8]
    assert backend.kept_version("me", before) is None
    with pytest.raises(CacheMiss):
        backend.backward_kept("me", before, g)
    assert backend.kept_version("me", after) == 8


def test_a_graph_kept_across_several_swaps_backpropagates_on_its_weights():
    """Slow volunteers and frequent rounds: a batch's backward pass can come several
    versions after its forward pass. Weights stay while a kept graph needs them, at most
    MAX_PREVIOUS_VERSIONS (older gradients would be refused as stale), and no longer
    than the graphs' time to live."""
    spec = ExpertSpec("ffn", 8, 16)
    backend = ExpertBackend(
        ExpertUID.parse("ffn.0.0"), spec, build_expert(spec, seed=3), version=1, max_previous=2
    )
    reference = ExpertBackend(ExpertUID.parse("ffn.0.0"), spec, build_expert(spec, seed=3))
    x, g = torch.randn(5, 8), torch.randn(5, 8)
    _, first = backend.forward(x, keep=True, owner="me")
    _, spare = backend.forward(x, keep=True, owner="me")
    assert first is not None
    assert spare is not None
    backend.replace_weights(build_expert(spec, seed=4), 2)
    _, on_2 = backend.forward(x, keep=True, owner="me")
    backend.replace_weights(build_expert(spec, seed=5), 3)
    assert [w.version for w in backend.previous] == [2, 1]
    torch.testing.assert_close(backend.backward_kept("me", first, g), reference.backward(x, g))
    oldest = backend.accumulators()[0][1]  # sent first: version 1's, where the graph was
    assert (oldest.samples, len(backend.accumulators())) == (5, 3)
    # a third swap: versions 3, 2 and 1 each hold a graph; 1 is beyond max_previous
    _, on_3 = backend.forward(x, keep=True, owner="me")
    assert on_2 is not None
    assert on_3 is not None
    backend.replace_weights(build_expert(spec, seed=6), 4)
    assert [w.version for w in backend.previous] == [3, 2]
    assert backend.kept_version("me", spare) is None
    assert (backend.kept_version("me", on_2), backend.kept_version("me", on_3)) == (2, 3)
    # graphs past their time to live keep no weights; weights that never kept one go
    for w in backend.previous:
        w.graphs.ttl = 0.0
    backend.replace_weights(build_expert(spec, seed=7), 5)
    assert [w.version for w in backend.previous] == []


async def test_an_emulated_device_takes_its_time_per_row_and_reports_it():
    pool = TaskPool(
        "t",
        lambda inputs, keep, owner, extras: (inputs[0], None, 0),
        trio.CapacityLimiter(1),
        max_batch_size=64,
        paced_seconds=lambda rows: 0.02 * rows,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        started = trio.current_time()
        async with trio.open_nursery() as inner:
            for _ in range(2):
                inner.start_soon(partial(pool.submit, torch.zeros(5, 1)))
        elapsed = trio.current_time() - started
        nursery.cancel_scope.cancel()
    assert elapsed >= 0.2  # ten rows, one batch or two: the device is held 0.02 s a row
    assert pool.stats.compute_seconds >= 0.2
    assert pool.stats.samples == 10


# ---------------------------------------------------------------- fairness (issue 14)


def test_fair_queue_serves_trainers_first_then_callers_in_turn():
    queue: FairQueue[str] = FairQueue(max_per_caller=100, max_strangers=100)
    for i in range(3):
        queue.push("crowd-a", f"a{i}", 10, STRANGER)
        queue.push("crowd-b", f"b{i}", 10, STRANGER)
    queue.push("trainer", "t0", 10, TRAINER)
    queue.push("trainer", "t1", 10, TRAINER)
    assert queue.take_batch(30) == ["t0", "t1", "a0"]
    assert queue.take_batch(30) == ["b0", "a1", "b1"]
    assert queue.take_batch(1000) == ["a2", "b2"]
    assert queue.take_batch(1000) == []
    assert queue.samples == 0


def test_fair_queue_caps_each_caller_and_the_strangers_together():
    queue: FairQueue[str] = FairQueue(max_per_caller=20, max_strangers=30)
    queue.push("a", "a0", 20, STRANGER)
    with pytest.raises(QueueFull, match="one caller"):
        queue.push("a", "a1", 1, STRANGER)
    queue.push("b", "b0", 10, STRANGER)
    with pytest.raises(QueueFull, match="strangers"):
        queue.push("c", "c0", 1, STRANGER)
    queue.push("trainer", "t0", 20, TRAINER)  # the strangers' share is not the trainers'
    assert queue.queued_for("a") == 20
    assert queue.take_batch(100) == ["t0", "a0", "b0"]
    queue.push("c", "c0", 1, STRANGER)  # room again


def test_a_request_larger_than_what_is_left_starts_the_next_batch():
    queue: FairQueue[str] = FairQueue(max_per_caller=100, max_strangers=100)
    queue.push("a", "big", 60, TRAINER)
    queue.push("b", "small", 30, TRAINER)
    queue.push("c", "next", 50, TRAINER)
    assert queue.take_batch(100) == ["big", "small"]
    assert queue.take_batch(100) == ["next"]


async def test_a_trainer_arriving_behind_a_crowd_runs_in_the_next_batch():
    ran: list[list[str]] = []

    def process(inputs, keep, owner, extras):
        ran.append([str(e) for e in extras])
        return inputs[0], None, 0

    pool = TaskPool(
        "t",
        process,
        trio.CapacityLimiter(1),
        max_batch_size=8,
        priority=lambda owner: TRAINER if owner == "trainer" else STRANGER,
        max_queued_strangers=1000,
    )
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as callers:
            for i in range(40):  # a crowd of identities, one full batch each
                callers.start_soon(
                    partial(pool.submit, torch.zeros(8, 1), owner=f"s{i}", extra=f"s{i}")
                )
            await trio.testing.wait_all_tasks_blocked()
            callers.start_soon(partial(pool.submit, torch.zeros(2, 1), owner="trainer", extra="t"))
            await trio.testing.wait_all_tasks_blocked()
            await outer.start(pool.run)
        outer.cancel_scope.cancel()
    assert ran[0] == ["t"]  # the trainer's request ran first, ahead of 40 batches
    assert len(ran) == 41


def test_kept_graphs_of_a_crowd_never_push_out_another_callers_graph():
    cache = GraphCache(max_bytes=1000, max_entries=100)
    x = torch.zeros(1)
    mine = cache.put("me", x, x, 100)
    assert mine is not None
    for i in range(50):  # each stranger keeps forward graphs as fast as it can
        cache.put(f"stranger{i % 5}", x, x, 100)
    assert cache.nbytes <= 1000
    cache.pop("me", mine)  # still there
    assert cache.evicted > 0


def test_one_caller_holds_at_most_its_share_of_kept_graphs():
    cache = GraphCache(max_bytes=1000, max_entries=100, max_owner_bytes=300)
    x = torch.zeros(1)
    handles = [cache.put("greedy", x, x, 100) for _ in range(10)]
    assert cache.held_by("greedy") == 300
    first, last = handles[0], handles[-1]
    assert first is not None
    assert last is not None
    with pytest.raises(CacheMiss):
        cache.pop("greedy", first)  # its own oldest went first
    cache.pop("greedy", last)
    assert cache.put("other", x, x, 301) is None  # larger than anyone's share


def test_a_request_that_keeps_its_graph_runs_alone():
    queue: FairQueue[str] = FairQueue(max_per_caller=100, max_strangers=100)
    queue.push("a", "a0", 10, TRAINER)
    queue.push("t", "keep", 10, TRAINER, solo=True)
    queue.push("b", "b0", 10, TRAINER)
    assert queue.take_batch(100) == ["a0"]
    assert queue.take_batch(100) == ["keep"]
    assert queue.take_batch(100) == ["b0"]


def test_strangers_take_at_most_their_share_of_a_batch():
    queue: FairQueue[str] = FairQueue(max_per_caller=100, max_strangers=100)
    for i in range(4):
        queue.push(f"s{i}", f"s{i}", 10, STRANGER)
    queue.push("t", "t0", 10, TRAINER)
    assert queue.take_batch(100, max_strangers=20) == ["t0", "s0", "s1"]
    assert queue.take_batch(100, max_strangers=20) == ["s2", "s3"]
