"""The README's owner section is a contract: its commands, run as written, one process
each on one computer (fresh folders, the template's defaults, no test hooks), publish a
project, announce it, aggregate, move every expert's version, train without a single
ban, and serve ``owner status``. When the README changes, this test runs the new text.

At 8609050 the same walk failed at the first long-running role: every role shared one
key, so the publisher refused to dial the bootstrap peer (itself) and the aggregator
found no provider of the weights but itself."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.child_processes import stop_processes
from tests.readme_walk import OwnerWalk, Running, command_words, is_long_running, readme_blocks
from tests.waiting import until


def versions(status: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for agg in status["aggregators"]:
        out.update(agg.get("versions", {}))
    return out


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_the_readme_owner_section_runs_as_written(tmp_path: Path) -> None:
    walk_blocks = readme_blocks("For project owners")
    walk, more = walk_blocks[0], walk_blocks[1]
    home = tmp_path / "owner"
    home.mkdir()
    owner = OwnerWalk(home)
    trainer: Running | None = None
    try:
        for command, _comment in walk:
            words = command_words(command)
            if not is_long_running(words):
                printed = owner.run(command)
                if words[:2] == ["owner", "status"]:
                    assert "experts covered:" in printed, printed
                continue
            role = owner.start(command)  # and waited for, as the owner would
            if words[:2] == ["owner", "publish"]:
                assert "moehome://join/" in str(role.first("invite:"))
            elif words[:2] == ["owner", "train"]:
                trainer = role
        assert trainer is not None, "the README's walk trains"
        status_json = next(c for c, _ in more if c.endswith("--json"))
        experts_total = 0

        def every_version_moved() -> bool:
            nonlocal experts_total
            for role in owner.running:
                if role is not trainer:
                    owner.alive(role)
            status = json.loads(owner.run(status_json))
            experts_total = status["experts_total"]
            moved = versions(status)
            return len(moved) == experts_total and min(moved.values()) >= 1

        until(every_version_moved, 420, "every expert's version moved", step=10)
        status = json.loads(owner.run(status_json))
        assert status["experts_covered"] == experts_total
        assert all(agg["banned_peers"] == 0 for agg in status["aggregators"]), status
        # the experts' rounds say how late their contributions landed
        late = [agg for agg in status["aggregators"] if agg.get("mean_versions_late") is not None]
        assert late, status["aggregators"]
        assert all(sum(agg["lateness"]) >= 1 for agg in late), late
        # (status["experts_waiting"] is not asserted here: a round may be waiting for the
        # second volunteer's next contribution at any instant; tests/unit's
        # test_a_round_is_stalled_only_after_a_round_s_time_without_enough_voices says when
        # a wait is reported)
        # Ctrl-C: the trainer evaluates, checkpoints, reports and exits cleanly
        if trainer.proc.poll() is None:
            trainer.proc.send_signal(signal.SIGINT)
        assert trainer.proc.wait(timeout=180) == 0, trainer.stderr.read_text()[-3000:]
        assert (home / "data" / "trainer" / owner.values["<project id>"]).is_dir()
        # the model taken out, as the README's next lines say: a folder transformers
        # loads, and text sampled from it
        export = next(c for c, _ in more if command_words(c)[:2] == ["owner", "export"])
        assert "experts: 16 at versions" in owner.run(export)
        assert (home / "model" / "model.safetensors").is_file()
        generate = next(c for c, _ in more if command_words(c)[:2] == ["owner", "generate"])
        assert owner.run(generate).startswith("def ")
        # the project page, as the README writes it: the trainer's signed evaluations (its
        # first, and the one Ctrl-C made), the volunteers' credit, every expert served
        page = next(
            c for c, _ in more if command_words(c)[:2] == ["owner", "page"] and "--out" in c
        )
        assert "page: " in owner.run(page)
        data = json.loads((home / "page" / "page.json").read_text())
        (curve,) = data["loss"]
        assert len(curve["points"]) >= 2, curve
        assert curve["points"][-1][4] < curve["points"][0][4], curve
        assert data["leaderboard"], data["status"]["aggregators"]
        assert data["status"]["experts_covered"] == experts_total
        for role in owner.running:
            assert role.errors() == [], f"{role.name}: {role.errors()[:5]}"
    finally:
        for role in owner.running:
            if role.proc.poll() is None:
                role.proc.send_signal(signal.SIGINT)
        try:
            for role in owner.running:
                role.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        stop_processes(role.proc for role in owner.running)
