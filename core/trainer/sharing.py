"""A trainer's side of the shared trunk on the network (core/trainer/trunk.py says what is
shared and why): sends its change to the trunk's aggregator every ``sync_every`` steps,
and rebases its copy onto each new version that includes the change. Between steps,
never blocking them: the training goes on while a change travels."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import trio

from core.contributing.codecs import codec
from core.experts.weights import WeightsError, load_weights_bytes
from core.experts.wire import to_wire
from core.project.chunks import ChunkStore
from core.project.distribution import FetchError, WeightsFetcher
from core.project.signed import SignedManifest
from core.project.versions import VersionFinder, VersionRecord, fetch_version
from core.protocol.aggregator_methods import CONTRIBUTE
from core.protocol.contributions import TRUNK_UID, Contribution, ParamSpec, Receipt
from core.trainer.session import TrainingSession
from core.trainer.trunk import Params, TrunkSync, build_trunk, snapshot
from net import Peer, RemoteError, RpcError

log = logging.getLogger(__name__)

#: how often the trainer looks for a new version and whether a change is due
CHECK_SECONDS = 1.0


class TrunkSharing:
    def __init__(
        self, peer: Peer, signed: SignedManifest, session: TrainingSession, store: Path
    ) -> None:
        m = signed.manifest
        self.peer = peer
        self.signed = signed
        self.session = session
        self.sync = TrunkSync(m.training.trunk.sync_every, session.trunk_weights())
        #: the trunk's versions, asked of its aggregator (the DHT when it does not answer)
        self.finder = VersionFinder.for_manifest(peer, signed)
        self.aggregator = self.finder.aggregator_of(TRUNK_UID)
        self.fetcher = WeightsFetcher(peer, ChunkStore(store))
        #: changes sent and taken, versions rebased onto
        self.sent = 0
        self.accepted = 0
        self.rebased = 0
        #: set once training ended and its last change is in a version taken (settle)
        self._settled = trio.Event()

    def stepped(self, samples: int) -> None:
        """The session applied a step of ``samples`` sequences."""
        self.sync.stepped(samples)

    async def settle(self) -> None:
        """After the last step: send what is left and wait (the caller bounds it) until
        a version holding it is taken (``run`` sends and takes it)."""
        self.sync.finishing = True
        if not self.sync.settled():
            await self._settled.wait()

    async def run(self) -> None:
        """Until cancelled: send what is due, take what is new."""
        while True:
            if self.sync.due():
                await self._send()
            try:
                record = (await self.finder.newest([TRUNK_UID]))[TRUNK_UID]
                if record is not None and self.sync.may_rebase(record.version):
                    await self._rebase(record)
            except (FetchError, WeightsError) as exc:
                log.info("could not take a new version of the trunk: %s", exc)
            if self.sync.finishing and self.sync.settled():
                self._settled.set()
            await trio.sleep(CHECK_SECONDS)

    async def _send(self) -> None:
        copy = await trio.to_thread.run_sync(self.session.trunk_weights)
        delta, base, samples = self.sync.take(copy)
        contribution, parts = await trio.to_thread.run_sync(
            self._contribution, delta, base, samples
        )
        self.sent += 1
        try:
            reply = await self.peer.rpc.call(
                self.aggregator,
                CONTRIBUTE,
                {"header": contribution.encode()},
                [to_wire(p) for p in parts],
                timeout=60,
            )
        except (RemoteError, RpcError) as exc:
            log.warning("the trunk's aggregator did not take our change: %s", exc)
            self.sync.refused()
            return
        version = reply.meta.get("version")
        self.sync.accepted(version if isinstance(version, int) else self.sync.version)
        self.accepted += 1

    def _contribution(
        self, delta: Params, base: int, samples: int
    ) -> tuple[Contribution, list[torch.Tensor]]:
        """The change as a contribution: sums over ``samples`` (the aggregator takes the
        mean per sample, as of every contribution), with a receipt the trainer signs for
        its own samples."""
        fp32 = codec("fp32")
        names = list(delta)
        parts = [p for n in names for p in fp32.encode((delta[n] * samples).reshape(-1))]
        identity = self.peer.identity
        project = self.signed.project_id
        receipt = Receipt.sign(identity, project, TRUNK_UID, base, [], [], samples)
        contribution = Contribution.create(
            identity,
            project=project,
            uid=TRUNK_UID,
            base_version=base,
            codec=fp32.name,
            params=[ParamSpec(n, delta[n].numel()) for n in names],
            receipts=[receipt],
            parts=parts,
        )
        return contribution, parts

    async def _rebase(self, record: VersionRecord) -> None:
        blob = await fetch_version(self.fetcher, record)
        new = await trio.to_thread.run_sync(self._load, blob, record)
        base = self.sync.took(new, record.version)
        await trio.to_thread.run_sync(self.session.rebase_trunk, base, new)
        version = record.version
        self.rebased += 1
        log.info("trunk: rebased onto version %d", version)

    def _load(self, blob: bytes, record: VersionRecord) -> Params:
        m = self.signed.manifest
        module = build_trunk(m.model, seed=m.weights.seed)
        load_weights_bytes(module, blob, expected_sha256=record.sha256)
        return snapshot(module)
