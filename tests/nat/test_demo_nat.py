"""`moehome demo --nat`: the demo's volunteers in two homes behind NAT routers, the
trainer in one of them, the bootstrap peer, the owner and the aggregator on the public
network. Volunteers behind NAT are found by the trainer, serve forward and backward
passes, their contributions reach the aggregator and they serve new weight versions;
the summary says how each was reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_the_demo_trains_with_volunteers_behind_nat(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "core.cli", "demo", "--nat", "--json"]
    cmd += ["--volunteers", "2", "--steps", "60", "--workdir", str(tmp_path / "demo")]
    # each volunteer the only server of half the experts: both must be reached (with
    # every expert on both, the trainer could route everything to its LAN neighbour)
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
    assert summary["steps"] == 60
    assert summary["failed_steps"] < 60
    volunteers = summary["per_volunteer"]
    assert {v["where"] for v in volunteers} == {"a/0", "b/0"}
    for v in volunteers:
        # found and used by a trainer in another home (b/1), through a relay or direct
        assert v["answers"] > 0, v
        assert v["reached"] in ("direct", "relayed"), v
        assert v["accepted"] > 0, v  # its contributions crossed its NAT to the aggregator
    # the one in the trainer's own home is reached over the home network
    assert next(v for v in volunteers if v["where"] == "b/0")["reached"] == "direct"
    # contributions crossed the NAT to the aggregator, and new versions came back
    assert summary["contributions_accepted"] > 0
    assert summary["version_max"] > 0
