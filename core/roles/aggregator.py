"""``moehome aggregator run``: an aggregator for the experts of a project that are its
responsibility, with its state in a folder that survives restarts."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch
import trio

from core.aggregator.auditor import ContributionFinding
from core.aggregator.core import AggregatorCore, AggregatorSettings
from core.aggregator.evaluations import EvaluationStore
from core.aggregator.robust import RobustSettings
from core.aggregator.service import AggregatorService
from core.aggregator.trunk import TrunkSettings
from core.errors import UserFacingError
from core.namespaces import moehome_validator
from core.project.assignment import expert_assignment
from core.project.bans import BanBoard
from core.project.chunks import ChunkStore
from core.project.distribution import (
    FetchError,
    ProjectNotFound,
    WeightsFetcher,
    WeightsService,
    find_manifest,
)
from core.project.joining import backends_from_files
from core.project.pins import PinStore
from core.project.signed import SignedManifest
from core.project.versions import pull_interval
from core.protocol.aggregator_methods import responsible_aggregator
from core.protocol.bans import Ban
from core.protocol.contributions import TRUNK_UID
from core.roles.peer import print_addresses
from core.trainer.initial import load_trunk, published_trunk
from core.trainer.trunk import build_trunk, shares_trunk
from net import Identity, Peer, PeerID, network_config
from net.identity import peer_id_from_public_key, public_key_of
from net.transport import EVERY_INTERFACE

log = logging.getLogger(__name__)


def settings_from(signed: SignedManifest, uids: Sequence[str]) -> AggregatorSettings:
    m = signed.manifest
    agg = m.training.aggregation
    trunk = m.training.trunk
    return AggregatorSettings(
        project=signed.project_id,
        spec=m.model.expert_spec(),
        uids=tuple(uids),
        trainers=frozenset(bytes.fromhex(t.key) for t in m.trainers),
        optimizer=m.training.optimizer,
        learning_rate=m.training.learning_rate,
        staleness_bound=m.training.staleness_bound,
        round_samples=m.training.round_samples,
        round_seconds=m.training.round_seconds,
        min_contributors=m.training.min_contributors,
        contribution_audit_rate=m.training.audit.contribution_rate,
        expert_schedule=m.training.expert_schedule.schedule(),
        robust=RobustSettings(
            rule=agg.rule,
            clip_radius=agg.clip_radius,
            momentum=agg.momentum,
            bucket_size=agg.buckets,
            trim_fraction=agg.trim_fraction,
        ),
        seed=m.weights.seed,
        trunk=(
            TrunkSettings(trunk.outer_learning_rate, trunk.outer_momentum, trunk.round_seconds)
            if TRUNK_UID in uids
            else None
        ),
    )


def my_uids(signed: SignedManifest, me: bytes) -> list[str]:
    keys = [bytes.fromhex(a.key) for a in signed.manifest.aggregators]
    if me not in keys:
        raise UserFacingError(
            f"this computer's key {me.hex()} is not an aggregator of project {signed.project_id}; "
            "add it to the manifest's [[aggregators]] and publish again"
        )
    peers = [peer_id_from_public_key(k) for k in keys]
    mine = peer_id_from_public_key(me)
    uids = [
        *signed.manifest.model.expert_uids(),
        *([TRUNK_UID] if shares_trunk(signed.manifest) else []),
    ]
    assignment = expert_assignment(signed.manifest)
    return [u for u in uids if responsible_aggregator(u, peers, assignment) == mine]


async def run_aggregator(
    identity: Identity,
    project_id: str,
    *,
    workdir: Path,
    data_dir: Path,
    listen: Sequence[str] | None,
    bootstrap: Sequence[str],
) -> None:
    config = network_config(listen or EVERY_INTERFACE, bootstrap, relay=True)
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(Peer(identity, config, validator=moehome_validator()).run)
        signed = await find_manifest(peer, project_id, PinStore(data_dir / "pinned-owners.json"))
        await nursery.start(aggregate, peer, signed, workdir)
        print_addresses(peer)
        await trio.sleep_forever()


async def aggregate(
    peer: Peer,
    signed: SignedManifest,
    workdir: Path,
    *,
    task_status: trio.TaskStatus[AggregatorService] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Aggregate, on a running ``peer``, the experts of ``signed``'s project that are its
    responsibility, with the state in ``workdir``; until cancelled."""
    uids = my_uids(signed, peer.identity.public_key)
    experts = [u for u in uids if u != TRUNK_UID]
    store = ChunkStore(workdir / "chunks")
    fetcher = WeightsFetcher(peer, store)
    try:
        files = await fetcher.fetch(signed, experts)
    except FetchError as exc:
        raise FetchError(
            f"{exc}: the aggregator starts from the published weights; is `moehome owner "
            "publish` running and connected to the swarm (its -b)?"
        ) from exc
    initial: dict[str, torch.nn.Module] = {
        uid: b.module
        for uid, b in (
            await trio.to_thread.run_sync(backends_from_files, signed.manifest, files)
        ).items()
    }
    if TRUNK_UID in uids:  # as every trainer starts it: the owner's, else from the seed
        trunk = build_trunk(signed.manifest.model, seed=signed.manifest.weights.seed)
        published = await published_trunk(fetcher, signed)
        if published is not None:
            await trio.to_thread.run_sync(load_trunk, trunk, published, signed.manifest.model)
        initial[TRUNK_UID] = trunk
    settings = settings_from(signed, uids)
    core = await trio.to_thread.run_sync(AggregatorCore, settings, workdir / "state", initial)
    try:
        WeightsService.of(peer, store)
        interval = pull_interval(signed.manifest.training.round_seconds)
        board = BanBoard(peer, signed, interval=interval)
        async with trio.open_nursery() as nursery:
            evaluations = EvaluationStore(
                workdir / "evaluations.bin", signed.project_id, settings.trainers
            )
            kept = await trio.to_thread.run_sync(evaluations.load)
            log.info("%d trainer evaluations kept from before", kept)
            service = await nursery.start(
                AggregatorService(peer, core, store=store, evaluations=evaluations).run
            )
            board.listeners.append(partial(_honour, service))
            if service.auditor is not None:
                service.auditor.listeners.append(partial(_accuse, board))
            await nursery.start(board.run)
            pins = PinStore(workdir / "pinned-owners.json")
            nursery.start_soon(_watch_manifest, peer, signed, pins, interval)
            log.info(
                "aggregating %d experts of %s at versions %s",
                len(uids),
                signed.project_id,
                core.versions,
            )
            task_status.started(service)
    finally:
        core.close()


async def _watch_manifest(
    peer: Peer, signed: SignedManifest, pins: PinStore, interval: float
) -> None:
    """Say when the owner publishes the project again: this aggregator goes on with the
    manifest it started with (its rounds, trainers and settings) until restarted."""
    pins.accept(signed)
    while True:
        await trio.sleep(interval)
        try:
            newest = await find_manifest(peer, signed.project_id, pins)
        except ProjectNotFound:
            continue
        if newest.serial > signed.serial:
            log.warning(
                "project %s was published again (serial %d; this aggregator runs %d): "
                "restart `moehome aggregator run` to apply it",
                signed.project_id,
                newest.serial,
                signed.serial,
            )
            return


def _accuse(board: BanBoard, finding: ContributionFinding) -> None:
    """Publish the ban of a volunteer whose contribution failed its audit (the evidence,
    too large for a DHT record, stays in the auditor's findings)."""
    board.accuse(
        finding.contributor,
        f"its contribution to {finding.uid} (version {finding.version}) is not what its "
        f"receipts compute ({finding.verdict.excess:.3g} x an honest contribution's bound)",
        b"",
        finding.verdict.excess,
    )


def _honour(service: AggregatorService, ban: Ban) -> None:
    """A project ban: the peer's contributions are refused, and what it has pending
    dropped."""
    try:
        key = public_key_of(PeerID.from_base58(ban.peer))
    except ValueError:
        key = None
    if key is not None:
        service.honour_ban(key)
