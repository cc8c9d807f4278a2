"""The trainer-side optimizer: Muon on the hidden matrices, AdamW on the rest
(core/trainer/optimizers.py), in the session and its checkpoints."""

from __future__ import annotations

import logging

import pytest
import torch

from core.trainer.data import Corpus, load_corpus
from core.trainer.model import CharLanguageModel
from core.trainer.optimizers import (
    TrainerOptimizer,
    muon_split,
    stale_rate,
    vocabulary_parameters,
)
from core.trainer.session import SessionSettings, TrainingSession
from tests.unit import test_trainer_model as trainer_model_test


def local_model(seed: int = 0) -> CharLanguageModel:
    return trainer_model_test.local_model(trainer_model_test.manifest(), seed)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus(max_bytes=400_000)


def test_muon_takes_the_hidden_matrices_and_adamw_the_tokens_maps_and_vectors():
    model = local_model()
    names = {id(p): n for n, p in model.named_parameters()}
    matrices, rest = muon_split(model)
    on_muon = {names[id(p)] for p in matrices}
    on_adamw = {names[id(p)] for p in rest}
    assert on_muon.isdisjoint(on_adamw)
    assert on_muon | on_adamw == set(names.values())
    # token maps (the embeddings, the output layer) and every vector stay on AdamW
    assert {"embed.weight", "position.weight", "head.weight", "head.bias"} <= on_adamw
    assert all(
        model.get_parameter(n).ndim == 1
        for n in on_adamw - {"embed.weight", "position.weight", "head.weight"}
        if ".experts." not in n
    )
    # attention's projections and the gates: Muon; the local experts stand for the
    # volunteers', which the aggregators train with the manifest's optimizer
    assert "attention.0.attn.in_proj_weight" in on_muon
    assert "attention.1.attn.out_proj.weight" in on_muon
    assert "mixtures.0.proj.weight" in on_muon
    assert "mixtures.1.experts.3.fc2.weight" in on_adamw
    assert not any(".experts." in n for n in on_muon)
    assert len(vocabulary_parameters(model)) == 4


def test_a_hugging_face_models_output_embeddings_stay_on_adamw():
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = torch.nn.Embedding(10, 4)
            self.inner = torch.nn.Linear(4, 4)
            self.lm_head = torch.nn.Linear(4, 10, bias=False)
            self.lm_head.weight = self.tokens.weight  # tied

        def get_output_embeddings(self) -> torch.nn.Module:
            return self.lm_head

    model = Tied()
    matrices, rest = muon_split(model)
    assert [id(p) for p in matrices] == [id(model.inner.weight)]
    assert {id(p) for p in rest} == {id(model.tokens.weight), id(model.inner.bias)}


def test_among_limits_what_is_trained():
    model = local_model()
    trunk = [p for n, p in model.named_parameters() if ".experts." not in n]
    optimizer = TrainerOptimizer(model, "muon", 1e-3, among=trunk)
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert trained == {id(p) for p in trunk}
    with pytest.raises(ValueError, match="trainer optimizer 'lion'"):
        TrainerOptimizer(model, "lion", 1e-3)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["adamw", "muon"])
def test_both_optimizers_lower_the_loss(corpus, kind):
    session = TrainingSession(
        local_model(),
        corpus,
        SessionSettings(project="p", batch_size=16, eval_batches=2, optimizer=kind),
    )
    before = session.evaluate()
    for _ in range(40):
        assert session.train_step() is not None
    assert session.evaluate() < 0.8 * before


def test_every_muon_matrix_moves_with_an_update_of_adamws_size(corpus):
    """match_rms_adamw: one rate serves both (a step's RMS about 0.2 x lr per element
    on every matrix, whatever its shape)."""
    session = TrainingSession(
        local_model(),
        corpus,
        SessionSettings(project="p", batch_size=8, learning_rate=1e-2, optimizer="muon"),
    )
    matrices, _ = muon_split(session.model)
    before = [p.detach().clone() for p in matrices]
    session.train_step()
    for p, b in zip(matrices, before, strict=True):
        rms = float((p.detach() - b).pow(2).mean().sqrt())
        assert 0.1 * 1e-2 < rms < 0.3 * 1e-2, (tuple(p.shape), rms)


def test_a_muon_checkpoint_resumes_exactly(tmp_path, corpus):
    settings = SessionSettings(project="p", batch_size=4, eval_batches=1, optimizer="muon")
    first = TrainingSession(local_model(), corpus, settings, tmp_path)
    for _ in range(3):
        first.train_step()
    first.save()
    resumed = TrainingSession(local_model(), corpus, settings, tmp_path)
    assert resumed.restore()
    first.train_step()
    resumed.train_step()
    for p, q in zip(first.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.allclose(p, q)


def test_a_checkpoint_of_the_other_optimizer_keeps_its_weights_and_says_so(
    tmp_path, corpus, caplog
):
    adamw = TrainingSession(
        local_model(), corpus, SessionSettings(project="p", batch_size=4), tmp_path
    )
    adamw.train_step()
    adamw.save()
    muon = TrainingSession(
        local_model(),
        corpus,
        SessionSettings(project="p", batch_size=4, optimizer="muon"),
        tmp_path,
    )
    with caplog.at_level(logging.WARNING, logger="core.trainer.session"):
        assert muon.restore()
    assert "another trainer optimizer than muon" in caplog.text
    for p, q in zip(adamw.model.parameters(), muon.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert all(not opt.state for opt in muon.optimizer)  # moments afresh
    assert muon.train_step() is not None


def test_a_checkpoint_of_before_the_choice_loads_as_adamw(corpus):
    model = local_model()
    old = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 256, (2, 16))).sum().backward()
    old.step()
    tensors: dict[str, torch.Tensor] = {}
    from core.checkpoints import optimizer_state

    meta = optimizer_state(old, "o", tensors)  # what sessions saved before
    optimizer = TrainerOptimizer(model, "adamw", 1e-3)
    assert optimizer.load(meta, tensors)
    (opt,) = list(optimizer)
    assert torch.equal(
        opt.state_dict()["state"][0]["exp_avg"], old.state_dict()["state"][0]["exp_avg"]
    )


def test_a_references_local_experts_keep_the_aggregators_rate(corpus):
    """As the aggregators train the volunteers' experts (the manifest's rate), whatever
    rate the trainer's layers are tuned to."""
    session = TrainingSession(
        local_model(),
        corpus,
        SessionSettings(
            project="p", batch_size=4, learning_rate=1e-2, optimizer="muon", local_expert_rate=3e-3
        ),
    )
    experts = session.optimizer.experts
    assert experts is not None
    names = {id(p): n for n, p in session.model.named_parameters()}
    on_experts = {names[id(p)] for g in experts.param_groups for p in g["params"]}
    assert on_experts == {n for n in names.values() if ".experts." in n}
    scheduled = {id(p) for g in session.optimizer.param_groups for p in g["params"]}
    assert scheduled.isdisjoint(id(p) for g in experts.param_groups for p in g["params"])
    assert session.train_step() is not None
    assert experts.param_groups[0]["lr"] == 3e-3
    assert all(g["lr"] == 1e-2 for g in session.optimizer.param_groups)


@pytest.mark.parametrize(
    ("kind", "staleness", "rate"),
    [
        ("adamw", 0, 1e-2),
        ("adamw", 1, 5e-3),
        ("adamw", 3, 2.5e-3),
        ("muon", 0, 1e-2),
        ("muon", 1, 1e-2),
        ("muon", 3, 1e-2),
    ],
)
def test_a_stale_gradient_is_slowed_on_adamw_and_not_on_muon(kind, staleness, rate):
    assert stale_rate(kind, 1e-2, staleness) == pytest.approx(rate)


def test_a_negative_staleness_is_a_mistake():
    with pytest.raises(ValueError, match="< 0"):
        stale_rate("adamw", 1e-2, -1)


@pytest.mark.parametrize(("kind", "divided_by"), [("adamw", 2), ("muon", 1)])
def test_the_session_applies_a_gradient_one_update_late_at_its_optimizers_rate(
    corpus, kind, divided_by
):
    settings = SessionSettings(
        project="p", batch_size=4, eval_batches=1, in_flight=2, optimizer=kind
    )
    session = TrainingSession(local_model(), corpus, settings)
    first, second = trainer_model_test._two_batches_at_once(session)
    assert (first.staleness, second.staleness) == (0, 1)
    # the rates the last (late) update was made at
    expected = session.schedule.rate(settings.learning_rate, 1) / divided_by
    assert [g["lr"] for g in session.optimizer.param_groups] == pytest.approx(
        [expected] * len(session.optimizer.param_groups)
    )
