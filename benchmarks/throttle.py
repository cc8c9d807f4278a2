"""How fast the node obeys the throttle, with fake probes: from the moment the fake user
becomes active until a new request is refused (pause), and back (resume).

    python benchmarks/throttle.py [--trials 20]

Prints one JSON line. The reference figure in the same run is the governor's polling
interval: a reaction can never be faster than one poll.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.control.preferences import Preferences
from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert
from core.experts.server import ExpertServer, ServerConfig
from core.experts.uid import ExpertUID
from core.moe.client import ExpertCaller, ExpertCallError, ExpertServerRef
from core.namespaces import moehome_validator
from core.node.governor import Governor
from core.node.probes import FakeProbes
from net.testing import open_swarm

SPEC = ExpertSpec("ffn", hidden=64, inner=256)


async def _run(trials: int) -> dict[str, Any]:
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        node, trainer = swarm.peers
        backend = ExpertBackend(ExpertUID.parse("ffn.0.0"), SPEC, build_expert(SPEC, seed=0))
        server = await nursery.start(ExpertServer(node, {"ffn.0.0": backend}, ServerConfig()).run)
        probes = FakeProbes()
        governor = await nursery.start(Governor(probes, Preferences, server).run)
        caller = ExpertCaller(trainer.rpc, forward_timeout=2)
        ref = [ExpertServerRef(node.peer_id, backend.sha256)]
        x = torch.randn(1, SPEC.hidden)

        async def serves() -> bool:
            try:
                await caller.forward("ffn.0.0", ref, x)
                return True
            except ExpertCallError:
                return False

        async def react(change: dict[str, float], want_serving: bool) -> float:
            t0 = trio.current_time()
            probes.set(**change)
            while await serves() != want_serving:  # noqa: ASYNC110 - polling the remote side is the measurement
                await trio.sleep(0.005)
            return trio.current_time() - t0

        pauses, resumes = [], []
        for _ in range(trials):
            pauses.append(await react({"idle_seconds": 1.0}, want_serving=False))
            resumes.append(await react({"idle_seconds": 3600.0}, want_serving=True))
        nursery.cancel_scope.cancel()
    return {
        "benchmark": "throttle",
        "trials": trials,
        "poll_interval_s": governor.interval,
        "pause_reaction_s_median": round(statistics.median(pauses), 3),
        "pause_reaction_s_max": round(max(pauses), 3),
        "resume_reaction_s_median": round(statistics.median(resumes), 3),
        "resume_reaction_s_max": round(max(resumes), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(trio.run(_run, args.trials)))


if __name__ == "__main__":
    main()
