"""`moehome demo --nat`: the demo's volunteers behind NAT routers, the trainer behind
another, the bootstrap peer, the owner and the aggregator on the public network.
Volunteers behind NAT are found by the trainer, serve forward and backward passes,
their contributions reach the aggregator and they serve new weight versions; the
summary says how each was reached.

One run covers both ways in: a volunteer behind a port-preserving ("cone") NAT is
reached directly after hole punching, one behind a symmetric NAT (where punching fails)
through a relay. Halfway, the bootstrap peer (a relay both hold places on) is killed:
they move to other relays and training goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_the_demo_trains_with_volunteers_behind_nat_and_survives_losing_a_relay(
    tmp_path: Path,
) -> None:
    cmd = [sys.executable, "-m", "core.cli", "demo", "--nat", "--symmetric", "--kill-relay"]
    cmd += ["--json", "--volunteers", "2", "--steps", "60", "--workdir", str(tmp_path / "demo")]
    # each volunteer the only server of half the experts: both must be reached (with
    # every expert on both, the trainer would route everything to the direct one)
    cmd += ["--experts", "8"]
    done = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=360,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["nat"]
    assert summary["symmetric"]
    assert summary["steps"] == 60
    assert summary["failed_steps"] < 60
    assert summary["relay_killed_at_step"] is not None
    volunteers = {v["where"]: v for v in summary["per_volunteer"]}
    assert set(volunteers) == {"a/0", "c/0"}  # the trainer is in home b
    for v in volunteers.values():
        assert v["answers"] > 0, v
        assert v["accepted"] > 0, v  # its contributions crossed its NAT to the aggregator
        # still used after the relay died: the symmetric one through another relay
        assert v["answers_after_relay_killed"] > 0, v
    assert volunteers["a/0"]["reached"] == "direct", volunteers  # hole punching worked
    assert volunteers["c/0"]["reached"] == "relayed", volunteers  # it cannot work there
    # contributions crossed the NAT to the aggregator, and new versions came back
    assert summary["contributions_accepted"] > 0
    assert summary["version_max"] > 0
