"""The whole system trains a model: `moehome demo`'s swarm (bootstrap, owner, aggregator,
volunteer nodes and a trainer, each its own process on 127.0.0.1) under churn and attacks.
Each run takes about a minute on two cores.

The model is the demo's Mixtral-style one reading bytes (`vocab_size=0`: 257 tokens),
so that 40 steps say something about the loss. Margins, on the held-out validation loss
(nats per byte; ln 257 = 5.55 at the start):
- clean, 4 volunteers: below 65% of the initial loss within 40 steps;
- churn (a third killed with SIGKILL mid-run, as many join): the same margin;
- one attacker in five (sign flip x1000), contributions unaudited: the robust rule alone
  keeps the loss within 10% of the clean run's;
- two attackers in six, one noising its answers, one sending ALIE gradients: the
  trainer's answer audits and the aggregator's contribution audits catch them, the
  project bans both (and no honest volunteer), and the loss stays within 10% of the
  clean run's.

Slow links are routed around in the emulated swarm (tests/processes/test_emulated_swarm.py),
where the volunteers' compute is emulated: here, on two loaded cores, the CPU decides
whether a far volunteer's queue is the shorter one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.demo import DemoOptions, run_demo
from core.project.credit_proof import verify_proof

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

STEPS = 40
_clean: dict[str, Any] = {}


async def demo(tmp_path: Path, **options: Any) -> dict[str, Any]:
    """A demo run; only the clean run exports and samples the model at the end (the
    others test training under attack and churn)."""
    options.setdefault("sample", False)
    opts = DemoOptions(
        steps=STEPS, eval_every=STEPS, workdir=tmp_path / "swarm", vocab_size=0, **options
    )
    summary = await run_demo(opts, quiet=True, handle_signals=False)
    assert summary["steps"] == STEPS
    return summary


async def clean_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The clean run with 4 volunteers, made once for this module's comparisons."""
    if not _clean:
        _clean.update(await demo(tmp_path_factory.mktemp("clean"), volunteers=4, sample=True))
    return _clean


def falls_by(summary: dict[str, Any], fraction: float) -> bool:
    return bool(summary["final_loss"] < fraction * summary["initial_loss"])


async def test_four_volunteers_train_the_model(tmp_path_factory):
    s = await clean_run(tmp_path_factory)
    assert s["initial_loss"] > 5.0
    assert falls_by(s, 0.65), s["evaluations"]
    # the experts were trained too, not only the trainer's layers: volunteers look for new
    # versions twice a round (4 s here), and the trainer's final evaluation waits for the
    # round after its last step (--final-round-wait), so it is answered by a version past
    # the one its steps used. (By steps alone, 40 steps once took 17-19 s and saw
    # versions 3-4; served lookups made them 9 s, and a run ended at version 1)
    assert s["version_max"] >= 2, (s["seconds"], s["version_min"], s["version_max"])
    assert s["contributions_accepted"] > 0
    assert s["contributions_rejected"] == {}
    # the model taken out of the swarm (owner export) and sampled (owner generate): a
    # continuation of each prompt
    assert s["generated"].count("def ") >= 1, s["generated"]
    assert all(v["answers"] > 0 for v in s["per_volunteer"])
    # the trainer recomputed a share of the answers, and every one was honest
    assert s["audits"]["audited"] > 0, s["audits"]
    assert s["audits"]["failed"] == 0, s["audits"]
    assert not any(v["excluded"] for v in s["per_volunteer"])
    # and the aggregator a share of the contributions (~300 in a run; 5% drawn): honest
    audited = s["contribution_audits"]
    assert audited["passed"] > 0, audited
    assert audited["failed"] == 0, audited
    assert not s["banned"]
    # every volunteer whose gradients reached a round earned credit (the aggregator's
    # signed account, on the project page's leaderboard; a volunteer the routing left
    # without training work, its answers all evaluations, has none to earn), and one
    # proved its own with `moehome credit`: a proof file that verifies with the
    # manifest alone
    assert all(v["credit"] is not None for v in s["per_volunteer"])
    in_rounds = [v for v in s["per_volunteer"] if v["influence"] is not None]
    assert len(in_rounds) >= 2, s["per_volunteer"]
    assert all(v["credit"] > 0 for v in in_rounds), [(v["name"], v["credit"]) for v in in_rounds]
    proof = s["proof"]
    assert verify_proof(Path(proof["proof"]).read_bytes()).total == pytest.approx(proof["credit"])
    assert proof["credit"] > 0
    # the project page (`owner page`, at the end): the trainer's signed evaluations, the
    # last of them its final loss
    page = json.loads((Path(s["page"]).parent / "page.json").read_text())
    (curve,) = page["loss"]
    assert curve["points"][0][4] == pytest.approx(s["initial_loss"])
    assert curve["points"][-1][4] == pytest.approx(s["final_loss"])
    assert curve["points"][-1][1] == STEPS
    assert page["status"]["experts_covered"] == page["status"]["experts_total"]


async def test_training_goes_on_when_a_third_of_the_volunteers_die(tmp_path):
    # the trainer as a project would run it on home links: two batches in flight,
    # activations and gradients as 4-bit codes
    s = await demo(tmp_path, volunteers=3, churn=True, in_flight=2, wire="q4")
    assert falls_by(s, 0.65), s["evaluations"]
    assert s["in_flight"] == 2
    # batches overlapped: most were applied one update after the weights they started on
    assert sum(s["staleness"].values()) == STEPS
    assert s["staleness"].get("1", 0) > STEPS / 2, s["staleness"]
    assert s["wire"] == "q4"
    # 4-bit codes and a bfloat16 scale per 64 values: (0.5 + 2/64) / 4 of float32's bytes
    assert s["calls"]["activation_bytes_ratio"] == pytest.approx(0.1328, abs=0.002)
    killed = [v for v in s["per_volunteer"] if "killed" in v["role"]]
    joined = [v for v in s["per_volunteer"] if "joined late" in v["role"]]
    assert len(killed) == 1
    assert len(joined) == 1
    assert joined[0]["answers"] > 0  # the newcomer took over work


async def test_one_attacker_in_five_does_not_spoil_training(tmp_path, tmp_path_factory):
    # the robust rule alone: no contribution is audited (an audit would ban the attacker
    # before its share could be measured)
    clean = await clean_run(tmp_path_factory)
    s = await demo(
        tmp_path, volunteers=4, attackers=1, attack="sign-flip", contribution_audit_rate=0.0
    )
    assert s["final_loss"] <= 1.1 * clean["final_loss"], (s["evaluations"], clean["evaluations"])
    attacker = next(v for v in s["per_volunteer"] if v["role"].startswith("attacker"))
    honest = [v for v in s["per_volunteer"] if v["role"] == "honest"]
    assert attacker["answers"] > 0  # it did serve, and its gradients were used or clipped
    # a gradient a thousand times too large keeps a tiny share of its weight
    assert attacker["accepted"] + sum(attacker["rejected"].values()) > 0
    assert attacker["influence"] is not None
    assert attacker["influence"] < 0.05
    assert min(v["influence"] for v in honest if v["influence"] is not None) > 0.3
    # credit follows the share kept: each of the attacker's samples earned a tiny share of
    # what an honest one did. Per sample, not in total: the trainer's routing gives the
    # volunteers very unequal work on two loaded cores (924 to 72,179 applied samples in
    # one run), and the attacker's ~1% of its samples once outweighed the whole credit
    # of the least used honest volunteer (210 against 405: CI failed so). An honest one's
    # share is forgiven the noise of rounds in which it had fewer samples than the others
    # (CI failed at 0.295 before: decision 014, stop 67)
    assert attacker["credit"] is not None
    assert attacker["samples"] > 0
    rate = {v["name"]: v["credit"] / v["samples"] for v in [*honest, attacker] if v["samples"]}
    assert rate[attacker["name"]] < 0.05, rate
    assert min(rate[v["name"]] for v in honest if v["samples"]) > 0.3, rate


async def test_volunteers_whose_answers_or_gradients_are_wrong_are_caught_and_banned(
    tmp_path, tmp_path_factory
):
    clean = await clean_run(tmp_path_factory)
    # one attacker noises its answers, the other sends ALIE gradients. A quarter of the
    # answers audited: a volunteer cheating on every one goes unseen for 100 answers
    # with probability 0.75^100 = 3e-13. Half the contributions: the gradient cheater
    # sends ~16 (one per expert) every 4 s, its first ones all unaudited with
    # probability 0.5^16. (The manifest's 5% is measured by benchmarks/audit.py.)
    s = await demo(
        tmp_path,
        volunteers=4,
        attackers=2,
        attack="noised-answers,alie",
        answer_audit_rate=0.25,
        contribution_audit_rate=0.5,
    )
    by_role = {v["role"]: v for v in s["per_volunteer"]}
    liar = by_role["attacker (noised-answers)"]
    poisoner = by_role["attacker (alie)"]
    honest = [v for v in s["per_volunteer"] if v["role"] == "honest"]
    # the trainer caught the wrong answers, the aggregator the wrong gradients
    assert liar["excluded"], (liar, s["audits"])
    assert not any(v["excluded"] for v in honest)
    assert s["audits"]["excluded"] == [liar["peer"]]
    assert s["contribution_audits"]["failed"] > 0, s["contribution_audits"]
    assert sorted(s["banned"]) == sorted([liar["peer"], poisoner["peer"]]), s["banned"]
    assert "is not what its receipts compute" in s["banned"][poisoner["peer"]]
    # the aggregator's own ban took back the poisoner's credit (the liar's ban is the
    # trainer's: the aggregator honours it once it reads the project's bans)
    assert poisoner["credit"] == 0
    assert all(v["credit"] > 0 for v in honest if v["influence"] is not None)
    assert s["final_loss"] <= 1.1 * clean["final_loss"], (s["evaluations"], clean["evaluations"])
