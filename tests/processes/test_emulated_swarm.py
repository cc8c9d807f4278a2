"""The emulated swarm (core/demo/emulated.py) with its volunteers spread over host
processes (core/demo/emulated_host.py): every part real, the volunteers' compute and
links emulated. What benchmarks/swarm_scaling.py measures rests on it."""

from __future__ import annotations

import psutil
import pytest

from core.demo.emulated import EmulationOptions, run_emulated
from core.demo.options import DemoOptions

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def test_volunteers_in_two_host_processes_serve_a_trainer_and_stop_with_it(tmp_path):
    options = EmulationOptions(
        volunteers=4,
        volunteer_processes=2,
        samples=64,  # 4 steps of 16
        batch_size=16,
        in_flight=2,
        samples_per_s=2.0,
        delay_ms=20,
    )
    out = await run_emulated(options, tmp_path)
    (summary,) = out["trainers"]
    assert out["samples"] == 64
    assert summary["failed_steps"] == 0
    assert summary["final_loss"] < summary["initial_loss"], summary
    # the volunteers of both hosts answered: each joined the project and served
    assert summary["volunteers_answered"] == 4, summary["answered_by"]
    # the host processes went with the swarm
    assert psutil.Process().children(recursive=True) == []


async def test_two_trainers_share_the_trunk_through_the_aggregator(tmp_path):
    options = EmulationOptions(
        volunteers=2,
        trainers=2,
        samples=192,  # 6 steps of 16 each
        batch_size=16,
        in_flight=1,
        samples_per_s=4.0,
        demo=DemoOptions(trunk_sync_every=2),
    )
    out = await run_emulated(options, tmp_path)
    assert out["samples"] == 192
    for summary in out["trainers"]:
        assert summary["failed_steps"] == 0
        assert summary["final_loss"] < summary["initial_loss"], summary
        trunk = summary["trunk"]
        # each sent its change every 2 steps, and took versions that held them
        assert trunk["changes_accepted"] >= 2, trunk
        assert trunk["rebased"] >= 2, trunk
        assert trunk["version"] >= 2, trunk
