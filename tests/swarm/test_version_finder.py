"""Versions asked of the aggregator directly: one request for many experts gives the records
the DHT holds, without a DHT lookup; the DHT still answers for the experts whose
aggregator is silent or does not hold them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from core.aggregator.core import AggregatorCore, AggregatorSettings
from core.aggregator.service import AggregatorService
from core.experts.registry import ExpertSpec
from core.namespaces import moehome_validator
from core.project.chunks import ChunkStore
from core.project.versions import VersionFinder, newest_version
from core.protocol.versions import CURRENT_VERSIONS, VERSION_NAMESPACE
from net import BadRequest, Peer
from net.codec import unpack_bounded
from net.testing import open_swarm

SPEC = ExpertSpec("ffn", hidden=8, inner=16)
PROJECT = "0123456789abcdef0123456789abcdef"
UIDS = ("ffn0.0", "ffn0.1", "ffn1.0")


@asynccontextmanager
async def aggregator_and_others(tmp_path: Path, others: int) -> AsyncIterator[list[Peer]]:
    """An aggregator of UIDS (its versions announced) and ``others`` peers of the swarm."""
    async with (
        open_swarm(1 + others, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        settings = AggregatorSettings(
            project=PROJECT, spec=SPEC, uids=UIDS, trainers=frozenset(), round_seconds=3600
        )
        core = AggregatorCore(settings, tmp_path / "agg")
        await nursery.start(
            AggregatorService(swarm.peers[0], core, store=ChunkStore(tmp_path / "chunks")).run
        )
        try:
            yield swarm.peers
        finally:
            core.close()
            nursery.cancel_scope.cancel()


async def test_the_aggregator_gives_the_records_of_many_experts_in_one_answer(tmp_path):
    async with aggregator_and_others(tmp_path, 1) as (aggregator, reader):
        finder = VersionFinder(reader, PROJECT, [aggregator.peer_id])
        gets_before = reader.dht.statistics().gets_by_namespace[VERSION_NAMESPACE]
        records = await finder.newest(UIDS)
        assert reader.dht.statistics().gets_by_namespace[VERSION_NAMESPACE] == gets_before
        assert (finder.stats.asked, finder.stats.answered) == (1, 1)
        assert (finder.stats.from_aggregators, finder.stats.dht_lookups) == (3, 0)
        # the very records the DHT holds
        allowed = {str(aggregator.peer_id)}
        for uid in UIDS:
            assert records[uid] is not None
            assert records[uid] == await newest_version(reader, PROJECT, uid, allowed)


async def test_the_dht_answers_for_an_aggregator_that_does_not_and_it_is_left_alone_a_while(
    tmp_path,
):
    async with aggregator_and_others(tmp_path, 2) as (aggregator, reader, silent):
        # "ffn0.0" assigned to a peer that serves no versions (an older moehome, say);
        # the DHT holds the real aggregator's record, which the manifest allows
        finder = VersionFinder(
            reader, PROJECT, [silent.peer_id, aggregator.peer_id], {"ffn0.0": 0, "ffn0.1": 1}
        )
        records = await finder.newest(["ffn0.0", "ffn0.1"])
        assert records["ffn0.0"] is not None
        assert records["ffn0.0"].author == aggregator.peer_id
        assert records["ffn0.1"] is not None
        assert (finder.stats.asked, finder.stats.answered, finder.stats.dht_lookups) == (2, 1, 1)
        # not asked again for a while: its experts go to the DHT at once
        await finder.newest(["ffn0.0"])
        assert (finder.stats.asked, finder.stats.dht_lookups) == (2, 2)


async def test_an_expert_the_aggregator_does_not_hold_is_looked_up_in_the_dht(tmp_path):
    async with aggregator_and_others(tmp_path, 1) as (aggregator, reader):
        finder = VersionFinder(reader, PROJECT, [aggregator.peer_id])
        records = await finder.newest(["ffn0.0", "ffn9.9"])
        assert records["ffn0.0"] is not None
        assert records["ffn9.9"] is None
        assert (finder.stats.from_aggregators, finder.stats.dht_lookups) == (1, 1)


MALFORMED: list[dict[str, Any]] = [
    {},
    {"project": PROJECT},
    {"project": PROJECT, "uids": "ffn0.0"},
    {"project": PROJECT, "uids": [1, 2]},
    {"project": PROJECT, "uids": [""]},
    {"project": PROJECT, "uids": ["x" * 129]},
    {"project": PROJECT, "uids": ["ffn0.0"] * 257},
    {"project": 7, "uids": ["ffn0.0"]},
]


async def test_malformed_requests_are_refused_and_the_aggregator_goes_on(tmp_path):
    async with aggregator_and_others(tmp_path, 1) as (aggregator, reader):
        for meta in MALFORMED:
            with pytest.raises(BadRequest):
                await reader.rpc.call(aggregator.peer_id, CURRENT_VERSIONS, meta, timeout=10)
        records = await VersionFinder(reader, PROJECT, [aggregator.peer_id]).newest(UIDS)
        assert all(r is not None for r in records.values())


async def test_another_projects_experts_get_no_records(tmp_path):
    async with aggregator_and_others(tmp_path, 1) as (aggregator, reader):
        reply = await reader.rpc.call(
            aggregator.peer_id,
            CURRENT_VERSIONS,
            {"project": "f" * 32, "uids": list(UIDS)},
            timeout=10,
        )
        assert unpack_bounded(bytes(reply.tensors[0].data), 1024) == {}
