"""An expert's version record outlives its ttl while the aggregator runs: rounds may wait
for a long time (too few volunteers), and a record that expired sent export, audits and
volunteers back to the expert's initial weights (benchmarks/real_model.py found an
exported expert at version 0 whose trainer had seen version 1 and later)."""

from __future__ import annotations

import trio

from core.aggregator.core import AggregatorCore, AggregatorSettings
from core.aggregator.service import AggregatorService
from core.experts.registry import ExpertSpec
from core.namespaces import moehome_validator
from core.project.chunks import ChunkStore
from core.project.versions import newest_version
from net.testing import open_swarm

SPEC = ExpertSpec("ffn", hidden=8, inner=16)
PROJECT = "0123456789abcdef0123456789abcdef"
TTL = 2.0


async def test_a_version_record_is_put_again_before_its_ttl_ends(tmp_path):
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        aggregator, reader = swarm.peers
        settings = AggregatorSettings(
            project=PROJECT, spec=SPEC, uids=("ffn0.0",), trainers=frozenset(), round_seconds=3600
        )
        core = AggregatorCore(settings, tmp_path / "agg")
        await nursery.start(
            AggregatorService(
                aggregator, core, store=ChunkStore(tmp_path / "chunks"), version_ttl=TTL
            ).run
        )
        allowed = {str(aggregator.peer_id)}
        assert await newest_version(reader, PROJECT, "ffn0.0", allowed) is not None
        # no round runs: without a refresh, the record is gone after the ttl
        await trio.sleep(2.5 * TTL)
        record = await newest_version(reader, PROJECT, "ffn0.0", allowed)
        assert record is not None
        assert record.version == 0
        core.close()
        nursery.cancel_scope.cancel()
