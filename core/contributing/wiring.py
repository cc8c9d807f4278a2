"""What a volunteer runs beside its expert server in a real project: the contribution
sender and the weights puller, wired so that a swap of weights first sends what was
accumulated on the old ones and then re-declares the experts."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import trio

from core.contributing.puller import WeightsPuller
from core.contributing.sender import ContributionSender, SenderConfig, SumsHook
from core.experts.backend import ExpertBackend
from core.experts.server import ExpertServer
from core.project.assignment import expert_assignment
from core.project.chunks import ChunkStore
from core.project.distribution import aggregator_peers
from core.project.manifest import Manifest
from core.project.versions import pull_interval
from net import Peer

log = logging.getLogger(__name__)


async def start_contributing(
    nursery: trio.Nursery,
    peer: Peer,
    project: str,
    manifest: Manifest,
    backends: Mapping[str, ExpertBackend],
    server: ExpertServer,
    data_dir: Path,
    *,
    on_result: Callable[[str, str], None] | None = None,
    sums_hook: SumsHook | None = None,
) -> ContributionSender | None:
    keys = [bytes.fromhex(a.key) for a in manifest.aggregators]
    if not keys:
        log.warning("project %s lists no aggregators: gradients are not sent anywhere", project)
        return None
    assignment = expert_assignment(manifest)
    sender: ContributionSender = await nursery.start(
        ContributionSender(
            peer,
            backends,
            aggregator_peers(peer, manifest),
            SenderConfig(
                project=project,
                every_samples=manifest.training.contribution_samples,
                every_seconds=manifest.training.contribution_seconds,
                kept_bytes=(
                    manifest.training.audit.kept_mib * 2**20
                    if manifest.training.audit.contribution_rate > 0
                    else 0
                ),
                round_seconds=manifest.training.round_seconds,
            ),
            on_result=on_result,
            sums_hook=sums_hook,
            assignment=assignment,
        ).run
    )
    puller = WeightsPuller(
        peer,
        project,
        backends,
        keys,
        ChunkStore(data_dir / "chunks"),
        server.device,
        before_swap=sender.flush,
        after_swap=server.announce_now,
        interval=pull_interval(manifest.training.round_seconds),
        assignment=assignment,
    )
    await nursery.start(puller.run)
    sender.on_stale = puller.nudge
    sender.on_round_close = puller.expect
    return sender
