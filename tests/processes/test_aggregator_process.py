"""kill -9 of the aggregator process in the middle of a round: after a restart, nothing
acknowledged is lost and nothing is counted twice; and after one, the credit it granted
is still stated (issue 42)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import trio

from core.contributing.codecs import codec
from core.experts.registry import build_expert
from core.experts.wire import to_wire
from core.namespaces import moehome_validator
from core.paths import identity_path
from core.project.credit_proof import collect_statements, proof_bytes, verify_proof
from core.project.keys import OwnerKey
from core.project.owner import project_status
from core.project.publish import prepare, serve_project
from core.project.signed import SignedManifest
from core.protocol.aggregator_methods import CONTRIBUTE, STATS
from core.protocol.contributions import Contribution, ParamSpec, Receipt
from net import Identity, Peer, RemoteError, Tensor, parse_peer_addr
from net.identity import load_or_create
from tests.child_processes import stop_processes
from tests.reports import stats_of
from tests.swarm.test_project import small_manifest

ROOT = Path(__file__).resolve().parents[2]


async def start_aggregator(
    data_dir: Path, pid: str, bootstrap: str
) -> tuple[subprocess.Popen[str], str]:
    cmd = [
        sys.executable,
        "-m",
        "core.cli",
        "--quiet",
        "--data-dir",
        str(data_dir),
        "aggregator",
        "run",
        "--project",
        pid,
        "-b",
        bootstrap,
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ})
    assert proc.stdout is not None
    # read in a thread: this process's own peers must keep answering meanwhile
    line = (await trio.to_thread.run_sync(proc.stdout.readline)).strip()
    assert line.startswith("/ip4/"), line
    return proc, line


async def proven_credit(volunteer: Peer, signed: SignedManifest) -> float:
    """The volunteer's credit as its aggregator states it, through a proof that verifies."""
    key = volunteer.identity.public_key
    statements, missing = await collect_statements(volunteer, signed, key)
    assert missing == {}
    return verify_proof(proof_bytes(signed, key, statements)).total


@pytest.mark.slow
async def test_kill_9_mid_round_loses_nothing_and_counts_nothing_twice(tmp_path):
    agg_dir = tmp_path / "aggregator"
    agg_key = load_or_create(identity_path(agg_dir, "aggregator")).public_key
    trainer, volunteer_id = Identity.generate(), Identity.generate()
    # one volunteer sends every contribution: its rounds need no other. No contribution
    # audits: one drawn (5% each by default) is held out of its round until revealed,
    # and this test counts the round's samples (held ones surviving a kill -9 are
    # tests/unit/test_aggregator_core.py's)
    manifest = small_manifest(
        tmp_path,
        **{
            "round_samples = 4096": "round_samples = 40",
            "min_contributors = 3": "min_contributors = 1",
            "contribution_rate = 0.05": "contribution_rate = 0.0",
        },
    )
    assert "contribution_rate = 0.0" in manifest.read_text()
    manifest.write_text(
        manifest.read_text()
        + f'\n[[aggregators]]\nkey = "{agg_key.hex()}"\n'
        + f'\n[[trainers]]\nkey = "{trainer.public_key.hex()}"\n'
    )
    prepared = prepare(manifest, OwnerKey.generate(), (), tmp_path / "owner")
    pid = prepared.signed.project_id
    spec = prepared.signed.manifest.model.expert_spec()
    uid = "ffn0.0.0"
    params = {n: p.numel() for n, p in build_expert(spec).named_parameters()}

    def make_contribution(scale: float) -> tuple[Contribution, list[Tensor]]:
        c = codec("fp16")
        parts = [part for n, k in params.items() for part in c.encode(torch.full((k,), scale))]
        receipts = [Receipt.sign(trainer, pid, uid, 0, [], [], 4) for _ in range(2)]
        msg = Contribution.create(
            volunteer_id,
            project=pid,
            uid=uid,
            base_version=0,
            codec="fp16",
            params=[ParamSpec(n, k) for n, k in params.items()],
            receipts=receipts,
            parts=parts,
        )
        return msg, [to_wire(p) for p in parts]

    procs = []
    try:
        async with trio.open_nursery() as nursery:
            owner: Peer = await nursery.start(
                Peer(Identity.generate(), validator=moehome_validator()).run
            )
            await nursery.start(serve_project, owner, prepared)
            volunteer: Peer = await nursery.start(
                Peer(volunteer_id, validator=moehome_validator()).run
            )

            proc, addr = await start_aggregator(agg_dir, pid, owner.addrs()[0])
            procs.append(proc)
            agg = parse_peer_addr(addr).peer_id
            await volunteer.host.connect_addr(addr)
            sent = [make_contribution(0.001 * (i + 1)) for i in range(3)]
            for msg, wires in sent:
                reply = await volunteer.rpc.call(agg, CONTRIBUTE, {"header": msg.encode()}, wires)
                assert reply.meta["accepted"] is True  # acknowledged: it must survive

            proc.send_signal(signal.SIGKILL)  # mid-round: 24 of 40 samples
            proc.wait()

            proc, addr = await start_aggregator(agg_dir, pid, owner.addrs()[0])
            procs.append(proc)
            await volunteer.host.connect_addr(addr)
            stats = stats_of((await volunteer.rpc.call(agg, STATS)).meta)
            assert stats["versions"][uid] == 0
            assert stats["pending_samples"][uid] == 24  # all three acknowledged ones are back
            msg, wires = sent[0]
            with pytest.raises(RemoteError) as info:  # a retry of one is not counted again
                await volunteer.rpc.call(agg, CONTRIBUTE, {"header": msg.encode()}, wires)
            assert info.value.code == "replay"

            for i in range(2):  # complete the round: 40 samples
                msg, wires = make_contribution(0.01 * (i + 1))
                await volunteer.rpc.call(agg, CONTRIBUTE, {"header": msg.encode()}, wires)
            with trio.fail_after(20):
                while stats_of((await volunteer.rpc.call(agg, STATS)).meta)["versions"][uid] < 1:
                    await trio.sleep(0.2)
            stats = stats_of((await volunteer.rpc.call(agg, STATS)).meta)
            assert stats["pending_samples"][uid] == 0
            assert stats["rejected"] == {"replay": 1}
            # the owner sees the same, rejections by reason, in `moehome owner status`
            status = await project_status(owner, pid, tmp_path / "owner-data")
            (agg_status,) = status["aggregators"]
            assert agg_status.get("rejected") == {"replay": 1}, agg_status
            assert agg_status["versions"][uid] == 1

            # the round granted credit; another kill -9 does not take it away
            credit = await proven_credit(volunteer, prepared.signed)
            assert credit > 0
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc, addr = await start_aggregator(agg_dir, pid, owner.addrs()[0])
            procs.append(proc)
            await volunteer.host.connect_addr(addr)
            assert await proven_credit(volunteer, prepared.signed) == pytest.approx(credit)
            nursery.cancel_scope.cancel()
    finally:
        stop_processes(procs)
