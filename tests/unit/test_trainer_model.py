"""The trainer's model and session without a swarm: causality, deterministic builds, the
published initial weights in the local reference, a loss that falls, checkpoints that
resume exactly; the attacks and the aggregator's influence measure."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest
import torch
import trio

from core.aggregator.robust import RobustSettings, influence
from core.demo.attacks import SIGN_FLIP_SCALE, Attack, alie, sign_flip
from core.errors import UserFacingError
from core.experts.records import SERVING, ExpertAnnouncement
from core.experts.registry import build_expert
from core.experts.spec import seed_for
from core.experts.uid import Grid
from core.moe.client import ExpertServerRef
from core.moe.finder import ExpertFinder, _speed_class, rank_servers
from core.project.manifest import Manifest, parse_manifest
from core.trainer.data import Corpus, load_corpus
from core.trainer.model import (
    CharLanguageModel,
    LocalMixtureOfExperts,
    attention_heads,
    build_model,
)
from core.trainer.noise_scale import NoiseScale
from core.trainer.session import SessionSettings, StepResult, TrainingSession
from core.trainer.train import TrainerOptions, check_trainer, mixture_config, resolve_device
from net import Identity

if TYPE_CHECKING:
    from core.trainer.train import TrainerOptions


def manifest(**model: object) -> Manifest:
    fields = {
        "hidden": 32,
        "context": 16,
        "mixture_layers": 2,
        "grid": [2, 2],
        "k_best": 2,
        "expert": {"kind": "ffn", "hidden": 32, "inner": 64},
    }
    fields.update(model)
    return parse_manifest({"project": {"name": "t"}, "model": fields, "weights": {"seed": 3}})


def local_model(m: Manifest, seed: int = 0) -> CharLanguageModel:
    section = m.model
    spec = section.expert_spec()
    return build_model(
        section,
        lambda _i, grid: LocalMixtureOfExperts(
            in_features=section.hidden, grid=grid, spec=spec, k_best=section.k_best, weights_seed=3
        ),
        seed=seed,
    )


def test_no_position_sees_later_tokens():
    model = local_model(manifest()).eval()
    tokens = torch.randint(0, 256, (3, 16))
    changed = tokens.clone()
    changed[:, 10:] = torch.randint(0, 256, (3, 6))
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-5)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_the_same_seed_builds_the_same_model_and_a_new_seed_another():
    m = manifest()
    one, two, other = local_model(m, 5), local_model(m, 5), local_model(m, 6)
    for (name, p), q, _r in zip(
        one.state_dict().items(),
        two.state_dict().values(),
        other.state_dict().values(),
        strict=True,
    ):
        assert torch.equal(p, q), name
    assert any(
        not torch.equal(p, r) for p, r in zip(one.parameters(), other.parameters(), strict=True)
    )


def test_the_local_reference_starts_from_the_published_expert_weights():
    m = manifest()
    model = local_model(m)
    mixture = model.mixtures[0]
    assert isinstance(mixture, LocalMixtureOfExperts)
    spec = m.model.expert_spec()
    for uid, expert in zip(mixture.uids, mixture.experts, strict=True):
        published = build_expert(spec, seed=seed_for(3, uid))
        for p, q in zip(expert.parameters(), published.parameters(), strict=True):
            assert torch.equal(p, q)


@pytest.mark.parametrize(("hidden", "heads"), [(64, 4), (32, 2), (48, 3), (30, 1), (7, 1)])
def test_attention_heads(hidden, heads):
    assert attention_heads(hidden) == heads
    assert hidden % attention_heads(hidden) == 0


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus(max_bytes=400_000)


def test_local_training_lowers_the_loss(corpus):
    session = TrainingSession(
        local_model(manifest()), corpus, SessionSettings(project="p", batch_size=16, eval_batches=2)
    )
    before = session.evaluate()
    for _ in range(60):
        assert session.train_step() is not None
    after = session.evaluate()
    assert before > 5.0  # about ln 256 = 5.55 at the start
    assert after < 0.75 * before
    assert session.state.initial_loss == before
    assert session.state.samples == 60 * 16


def test_a_checkpoint_resumes_exactly(tmp_path, corpus):
    settings = SessionSettings(project="p", batch_size=4, eval_batches=1)
    first = TrainingSession(local_model(manifest()), corpus, settings, tmp_path)
    first.evaluate()
    for _ in range(3):
        first.train_step()
    first.save()
    resumed = TrainingSession(local_model(manifest()), corpus, settings, tmp_path)
    assert resumed.restore()
    assert resumed.state == first.state
    for p, q in zip(first.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)
    # the same next batch and the same optimizer state: the same next step
    first.train_step()
    resumed.train_step()
    for p, q in zip(first.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.allclose(p, q)
    other = TrainingSession(local_model(manifest()), corpus, SessionSettings(project="q"), tmp_path)
    assert not other.restore()  # another project's checkpoint is not used


def test_sign_flip_and_alie():
    g = {"w": torch.tensor([1.0, -2.0])}
    assert torch.equal(sign_flip(g)["w"], torch.tensor([-SIGN_FLIP_SCALE, 2 * SIGN_FLIP_SCALE]))
    history = [{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([3.0, 0.0])}]
    out = alie(history[-1], history, z=1.0)["w"]
    # mean 2, std sqrt(2) on the first coordinate; nothing to hide in on the second
    assert torch.allclose(out, torch.tensor([2.0 - 2**0.5, 0.0]))
    attack = Attack("alie")
    sums = attack("e", {"w": torch.tensor([4.0, 4.0])}, samples=4)
    assert torch.allclose(sums["w"], torch.tensor([0.0, 0.0]))  # mean - |mean| at first
    with pytest.raises(ValueError, match="unknown attack"):
        Attack("nonsense")


@pytest.mark.parametrize(
    ("rule", "inputs", "kept"),
    [
        # three honest inputs near the aggregate and one a thousand times too large
        (
            "centered_clip",
            {"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [1.0, 1.0], "x": [-1000.0, -1000.0]},
            {"a": 1.0, "b": 1.0, "c": 1.0, "x": 0.0005},
        ),
        ("mean", {"a": [1.0, 0.0], "x": [-1000.0, 0.0]}, {"a": 1.0, "x": 1.0}),
        ("median", {"a": [1.0], "b": [2.0], "x": [100.0]}, {"a": 1.0, "b": 1.0, "x": 0.00508}),
    ],
)
def test_influence(rule, inputs, kept):
    aggregate = (
        torch.tensor([0.5, 0.5]) if len(next(iter(inputs.values()))) == 2 else torch.tensor([1.5])
    )
    got = influence(
        {k: torch.tensor(v) for k, v in inputs.items()}, aggregate, RobustSettings(rule=rule)
    )
    assert got == pytest.approx(kept, abs=1e-4)


@pytest.mark.parametrize(
    ("seconds", "speed_class"),
    [(None, 0), (0.002, 0), (0.01, 0), (0.015, 1), (0.03, 2), (0.11, 4), (0.5, 6)],
)
def test_latency_classes(seconds, speed_class):
    assert _speed_class(seconds) == speed_class


def test_a_slow_server_is_tried_after_a_fast_one():
    finder = ExpertFinder(dht=None, project="p", grid=Grid("ffn", (2,)))  # type: ignore[arg-type]
    fast, slow = (
        ExpertServerRef(Identity.generate().peer_id),
        ExpertServerRef(Identity.generate().peer_id),
    )
    finder.report_latency(slow, 0.12)
    finder.report_latency(fast, 0.004)
    finder.report_latency(fast, 0.006)
    assert finder.latency(fast.peer_id) == pytest.approx(0.7 * 0.004 + 0.3 * 0.006)

    async def records(_name: str) -> list[tuple[bytes, object]]:
        return [
            (ExpertAnnouncement("ffn.0", SERVING, 0, "", 0.0, 64).encode(), s.peer_id)
            for s in (slow, fast)
        ]

    finder._records = records  # type: ignore[method-assign,assignment]
    for _ in range(5):
        servers = trio.run(finder.servers, "ffn.0")
        assert [s.peer_id for s in servers] == [fast.peer_id, slow.peer_id]


def test_a_computer_that_is_not_a_trainer_of_the_project_is_told_what_to_do():
    me, other = Identity.generate(), Identity.generate()
    signed = SimpleNamespace(
        project_id="f" * 32,
        manifest=SimpleNamespace(trainers=[SimpleNamespace(key=other.public_key.hex())]),
    )
    check_trainer(signed, other)  # type: ignore[arg-type]
    with pytest.raises(UserFacingError, match=r"add it to the manifest's \[\[trainers\]\]"):
        check_trainer(signed, me)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the table is for a machine without CUDA")
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("auto", "cpu"),
        ("cpu", "cpu"),
        ("cuda", "torch sees no CUDA GPU"),
        ("cuda:1", "torch sees no CUDA GPU"),
        ("nonsense", "--device 'nonsense'"),
        ("meta", "use auto, cpu or cuda"),
    ],
)
def test_the_trainer_device(name, expected):
    if expected == "cpu":
        assert resolve_device(name) == "cpu"
        return
    with pytest.raises(UserFacingError, match=re.escape(expected)):
        resolve_device(name)


def test_servers_reached_only_through_a_relay_are_tried_last():
    ids = [Identity.generate().peer_id for _ in range(4)]
    direct_slow, relayed_fast, direct_fast, relayed_slow = (ExpertServerRef(i) for i in ids)
    latency = {ids[0]: 0.3, ids[1]: 0.005, ids[2]: 0.005, ids[3]: 0.3}
    ranked = rank_servers(
        [relayed_slow, relayed_fast, direct_slow, direct_fast], latency, relayed={ids[1], ids[3]}
    )
    assert ranked == [direct_fast, direct_slow, relayed_fast, relayed_slow]


def _two_batches_at_once(
    session: TrainingSession, starts: list[list[torch.Tensor]] | None = None
) -> list[StepResult]:
    """Workers 0 and 1 each carry a batch; both have copied the master's weights before
    either computes (a barrier in the model's forward pass), so one batch's gradients
    arrive one update late. ``starts`` gets the weights each batch started from."""
    import threading

    barrier = threading.Barrier(2, timeout=30)

    def meet(module: torch.nn.Module, *_: object) -> None:
        if starts is not None:
            starts.append([p.detach().clone() for p in module.parameters()])
        barrier.wait()

    for replica in session._replicas:
        replica.register_forward_pre_hook(meet)
    results: list[StepResult | None] = [None, None]

    def carry(worker: int) -> None:
        results[worker] = session.step_on(worker)

    threads = [threading.Thread(target=carry, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    done = [r for r in results if r is not None]
    assert len(done) == 2, results
    return sorted(done, key=lambda r: r.staleness)


@pytest.mark.parametrize(("max_staleness", "applied"), [(1, [True, True]), (0, [True, False])])
def test_batches_in_flight_apply_gradients_up_to_the_staleness_bound(
    corpus, max_staleness, applied
):
    settings = SessionSettings(
        project="p", batch_size=4, eval_batches=1, in_flight=2, max_staleness=max_staleness
    )
    session = TrainingSession(local_model(manifest()), corpus, settings)
    before = [p.detach().clone() for p in session.model.parameters()]
    first, second = _two_batches_at_once(session)
    assert (first.staleness, second.staleness) == (0, 1)
    assert [first.applied, second.applied] == applied
    assert session.state.step == sum(applied)
    assert session.state.samples == 4 * sum(applied)
    assert session.state.stale_steps == applied.count(False)
    assert session.state.staleness == {0: 1, **({1: 1} if all(applied) else {})}
    # the master moved; the replicas are copies, not the master
    assert any(
        not torch.equal(p, q) for p, q in zip(before, session.model.parameters(), strict=True)
    )
    assert all(r is not session.model for r in session._replicas)


def test_a_batch_starts_where_the_master_is_predicted_to_be_when_its_gradients_arrive(corpus):
    settings = SessionSettings(project="p", batch_size=4, eval_batches=1, in_flight=2)
    session = TrainingSession(local_model(manifest()), corpus, settings)
    first = session.step_on(0)
    assert first is not None
    assert first.applied  # one update to extrapolate from
    master = [p.detach().clone() for p in session.model.parameters()]
    update = session._last_update
    starts: list[list[torch.Tensor]] = []
    _two_batches_at_once(session, starts)
    # the first to start expects no update before its own; the second, one (the first's)
    predicted = [m + u for m, u in zip(master, update, strict=True)]
    ahead = [all(torch.allclose(a, b) for a, b in zip(s, predicted, strict=True)) for s in starts]
    exact = [all(torch.equal(a, b) for a, b in zip(s, master, strict=True)) for s in starts]
    assert sorted(ahead) == [False, True]
    assert sorted(exact) == [False, True]
    assert ahead != exact


def test_training_with_batches_in_flight_lowers_the_loss_like_one_at_a_time(corpus):
    import concurrent.futures

    def train(in_flight: int) -> tuple[float, float]:
        session = TrainingSession(
            local_model(manifest()),
            corpus,
            SessionSettings(project="p", batch_size=16, eval_batches=2, in_flight=in_flight),
        )
        before = session.evaluate()
        with concurrent.futures.ThreadPoolExecutor(in_flight) as pool:
            for _ in range(60 // in_flight):
                list(pool.map(session.step_on, range(in_flight)))
        assert session.state.step + session.state.stale_steps == 60
        return before, session.evaluate()

    before, one_at_a_time = train(1)
    _, four = train(4)
    assert one_at_a_time < 0.75 * before
    assert four < 0.75 * before


class FixedNoiseScale(NoiseScale):
    def __init__(self, batch: int, known: float) -> None:
        super().__init__(batch)
        self.known = known

    def add(self, sample: torch.Tensor) -> None:
        pass

    @property
    def pairs(self) -> int:
        return 10

    @property
    def sequences(self) -> float | None:
        return self.known


def ramped(tmp_path: Path, steps: int) -> TrainerOptions:
    """Options of a trainer that ramps up to 3 batches of 16 in flight, never evaluating
    or checkpointing on the way."""
    from core.trainer.train import TrainerOptions

    return TrainerOptions(
        project="p",
        workdir=tmp_path,
        steps=steps,
        batch_size=16,
        eval_every=10**9,
        checkpoint_every=10**9,
        in_flight=3,
        ramp_in_flight=True,
    )


@pytest.mark.parametrize(
    ("noise_scale", "carried_at_most"),
    [(5.0, 1), (1000.0, 3)],  # below one batch of 16: one at a time; far above: the limit
)
async def test_batches_in_flight_ramp_up_with_the_noise_scale(
    corpus, tmp_path, noise_scale: float, carried_at_most: int
) -> None:
    import threading

    from core.trainer.train import _train

    session = TrainingSession(
        local_model(manifest()),
        corpus,
        SessionSettings(project="p", batch_size=16, eval_batches=1, in_flight=3),
    )
    # the estimate as it would stand (its own tests: tests/unit/test_noise_scale.py)
    session.noise = FixedNoiseScale(16, known=noise_scale)
    changed, now, most, workers = threading.Condition(), [0], [0], set()
    step_on = session.step_on

    def counted(worker: int) -> StepResult | None:
        with changed:
            now[0] += 1
            most[0] = max(most[0], now[0])
            workers.add(worker)
            changed.notify_all()
            if session.state.step > 0:  # the ramp may widen after a step: let it, or not
                changed.wait_for(lambda: most[0] >= carried_at_most, timeout=30.0)
        try:
            return step_on(worker)
        finally:
            with changed:
                now[0] -= 1

    session.step_on = counted  # type: ignore[method-assign]
    summary = await _train(session, ramped(tmp_path, steps=12), trio.Event(), lambda event: None)
    assert summary["in_flight_reached"] == carried_at_most
    assert summary["in_flight_end"] == carried_at_most
    assert 1 <= summary["in_flight_mean"] <= carried_at_most
    assert most[0] == carried_at_most
    assert workers == set(range(carried_at_most))
    assert summary["steps"] + summary["stale_steps"] >= 12


async def test_batches_in_flight_come_down_when_the_noise_scale_falls(corpus, tmp_path) -> None:
    """An early high estimate (stop 53's 16-volunteer run) no longer holds the trainer at
    its widest for the rest of the run: once the estimate falls below one batch, the
    batches carried at once come down, one at a time, to one: the other workers start
    only what they had begun to start (without the ramp down, two thirds of the rest)."""
    import threading

    from core.trainer.train import _train

    session = TrainingSession(
        local_model(manifest()),
        corpus,
        SessionSettings(project="p", batch_size=16, eval_batches=1, in_flight=3),
    )
    noise = FixedNoiseScale(16, known=1000.0)
    session.noise = noise
    lock = threading.Lock()
    starts_after_fall = {0: 0, 1: 0, 2: 0}
    fell = threading.Event()
    step_on = session.step_on

    def counted(worker: int) -> StepResult | None:
        with lock:
            if fell.is_set():
                starts_after_fall[worker] += 1
            elif session.state.step >= 6:
                noise.known = 5.0  # below one batch: the ramp should come down to one
                fell.set()
        return step_on(worker)

    session.step_on = counted  # type: ignore[method-assign]
    summary = await _train(session, ramped(tmp_path, steps=30), trio.Event(), lambda event: None)
    assert summary["in_flight_reached"] == 3  # it did widen first
    assert summary["in_flight_end"] == 1
    assert 1 < summary["in_flight_mean"] < 3
    assert fell.is_set()
    others = starts_after_fall[1] + starts_after_fall[2]
    assert others <= 4, starts_after_fall
    assert starts_after_fall[0] >= 15, starts_after_fall


@pytest.mark.parametrize("forward_timeout", [10.0, 60.0])
def test_a_layers_backward_pass_may_take_as_long_as_its_calls(tmp_path, forward_timeout):
    """The layer's deadline follows ``forward_timeout`` as the callers' does (at 4 slow
    volunteers with 2 batches in flight a layer's backward pass took over MoEConfig's
    fixed 20 s, well within its calls' 120 s, and every step failed)."""
    options = TrainerOptions(project="p", workdir=tmp_path, forward_timeout=forward_timeout)
    config = mixture_config(manifest().model, options)
    assert config.forward_timeout == forward_timeout
    assert config.backward_timeout == options.backward_timeout() == 2 * forward_timeout
