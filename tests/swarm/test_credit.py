"""Credit over the network (issue 42): a volunteer asks the project's aggregators for
their signed statements (agg.credit) on real peers, and the proof they make verifies
with the file alone, with the credit the aggregator's books hold."""

from __future__ import annotations

import time

import pytest
import trio

from core.aggregator.core import AggregatorCore
from core.aggregator.service import AggregatorService
from core.namespaces import moehome_validator
from core.node.credit import check_credit
from core.project.credit_proof import collect_statements, proof_bytes, verify_proof
from core.project.signed import SignedManifest
from core.protocol.aggregator_methods import STATS, AggregatorReport
from core.protocol.credit import CREDIT, day_of
from net import Identity, RemoteError
from net.testing import open_swarm
from tests.reports import stats_of
from tests.unit.test_aggregator_core import contribution, settings
from tests.unit.test_credit_proof import signed_manifest


async def test_a_volunteer_proves_the_credit_its_aggregator_granted(tmp_path):
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        aggregator, volunteer = swarm.peers
        signed: SignedManifest = signed_manifest([aggregator.identity])
        core = AggregatorCore(settings(project=signed.project_id), tmp_path / "agg")
        others = [Identity.from_seed(bytes([i]) * 32) for i in range(2)]
        for who in [volunteer.identity, *others]:
            core.submit(*contribution(core, who, samples=8, project=signed.project_id))
        core.run_round("ffn0.0.0")
        granted_on = day_of(time.time())
        granted = core.credit.total(volunteer.identity.public_key.hex())
        assert granted > 0
        await nursery.start(AggregatorService(aggregator, core).run)

        statements, missing = await collect_statements(
            volunteer, signed, volunteer.identity.public_key
        )
        assert missing == {}
        verified = verify_proof(proof_bytes(signed, volunteer.identity.public_key, statements))
        assert verified.total == pytest.approx(granted)
        # the owner's view (agg.stats, as `owner status --json` shows it) says the same
        report = AggregatorReport.model_validate(
            stats_of(
                (await volunteer.rpc.call(aggregator.peer_id, STATS)).meta,
                aggregator.identity.public_key,
            )
        )
        assert report.contributors[volunteer.identity.public_key.hex()].credit == pytest.approx(
            verified.total
        )
        # the node's own look (core/node/credit.py): the figures, and the proof kept
        credit = await check_credit(
            volunteer, signed, volunteer.identity.public_key, tmp_path / "node"
        )
        assert credit.total == pytest.approx(granted)
        assert credit.today == pytest.approx(granted)
        # what the dashboard plots: the day's credit, as signed
        assert [d.day for d in credit.days] == [granted_on]
        assert credit.days[0].credit == pytest.approx(granted)
        assert (credit.aggregators, credit.aggregators_listed) == (1, 1)
        # its place among the three contributors (all sent 8 samples: equal credit, then
        # ordered by key)
        rows = sorted(who.public_key.hex() for who in [volunteer.identity, *others])
        assert (credit.rank, credit.ranked) == (
            rows.index(volunteer.identity.public_key.hex()) + 1,
            3,
        )
        kept = tmp_path / "node" / "credit" / f"{signed.project_id}.proof"
        assert credit.proof == str(kept)
        assert verify_proof(kept.read_bytes()).total == pytest.approx(granted)
        # somebody who never contributed: a statement of nothing, not an error
        nobody = Identity.generate().public_key
        statements, _ = await collect_statements(volunteer, signed, nobody)
        assert verify_proof(proof_bytes(signed, nobody, statements)).total == 0
        # a malformed request is refused by name
        with pytest.raises(RemoteError, match="32-byte"):
            await volunteer.rpc.call(aggregator.peer_id, CREDIT, {"contributor": b"x"})
        # under another project's manifest that lists the same aggregator (another
        # owner's key: another project id), its statement is not about that project
        other = signed_manifest([aggregator.identity])
        assert other.project_id != signed.project_id
        _, missing = await collect_statements(volunteer, other, volunteer.identity.public_key)
        assert list(missing.values()) == ["its statement did not verify"]
        core.close()
        nursery.cancel_scope.cancel()
