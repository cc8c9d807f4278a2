"""The volunteer's node: one process that joins the swarm (and a project), serves the
experts the swarm covers least, sends contributions, pulls new versions, obeys the
throttle, and answers the local control API."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from core.contrib.sender import ContributionSender
from core.contrib.wiring import start_contributing
from core.experts.records import SERVING, ExpertAnnouncement, expert_key
from core.experts.server import ExpertServer, ServerConfig
from core.namespaces import moehome_validator
from core.node.choice import choose_experts
from core.node.control_server import NodeControl, serve_control
from core.node.governor import Governor
from core.node.history import History
from core.node.preferences import load_preferences
from core.node.probes import Probes, probe_for_this_os
from core.project.distribution import find_manifest
from core.project.pins import PinStore
from core.project.publish import join_project
from net import Identity, Peer, PeerConfig
from net.host import DEFAULT_LISTEN

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeOptions:
    data_dir: Path
    config_dir: Path
    project: str | None = None
    bootstrap: Sequence[str] = ()
    listen: Sequence[str] = DEFAULT_LISTEN
    experts: int = 2  # how many experts to serve
    control_port: int = 0


@dataclass
class Node:
    identity: Identity
    options: NodeOptions
    probes: Probes = field(default_factory=probe_for_this_os)
    started: float = field(default_factory=time.time)
    peer: Peer | None = None
    server: ExpertServer | None = None
    sender: ContributionSender | None = None
    governor: Governor | None = None
    control: NodeControl | None = None
    control_url: str = ""
    history: History | None = None

    def status(self) -> dict[str, Any]:
        decision = self.governor.decision if self.governor else None
        serving = sorted(self.server.backends) if self.server else []
        state = (
            "no project"
            if not self.options.project
            else ("starting" if decision is None else "working" if decision.run else "paused")
        )
        return {
            "state": state,
            "reason": decision.describe() if decision else "starting",
            "project": self.options.project,
            "experts": {u: self.server.backends[u].version for u in serving} if self.server else {},
            "contributions": {
                "sent": self.sender.stats.sent,
                "accepted": self.sender.stats.accepted,
                "refused": dict(self.sender.stats.refused),
            }
            if self.sender
            else {},
            "peers": len(self.peer.dht.known_peers()) if self.peer else 0,
            "peer_id": str(self.identity.peer_id),
            "uptime_s": round(time.time() - self.started),
        }

    async def run(self, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        opts = self.options
        prefs_path = opts.config_dir / "preferences.json"
        config = PeerConfig(listen=tuple(opts.listen), bootstrap=tuple(opts.bootstrap))
        async with trio.open_nursery() as nursery:
            self.peer = await nursery.start(
                Peer(self.identity, config, validator=moehome_validator()).run
            )
            if opts.project:
                await self._join(nursery, opts.project)
            self.governor = Governor(self.probes, lambda: self._prefs(), self.server)
            control = NodeControl(
                self.status,
                self.governor.pause,
                self.governor.resume,
                self.governor.snooze,
                prefs_path,
                load_preferences(prefs_path),
                after_command=self.governor.step,
                history=self._history_since,
            )
            self.control = control
            await nursery.start(self.governor.run)
            self.control_url = await nursery.start(
                partial(serve_control, control, opts.data_dir, port=opts.control_port)
            )
            self.history = History(opts.data_dir / "history.sqlite")
            nursery.start_soon(self._record_history)
            log.info("node %s up; control API at %s", self.identity.peer_id, self.control_url)
            task_status.started(self)
            await trio.sleep_forever()

    async def _record_history(self, every: float = 10.0) -> None:
        """Every ``every`` seconds: allowed-to-work time, samples done, temperatures."""
        last_samples = 0
        try:
            while True:
                await trio.sleep(every)
                samples = self._samples_done()
                reading = self.governor.last_reading if self.governor else None
                decision = self.governor.decision if self.governor else None
                assert self.history is not None
                self.history.record(
                    time.time(),
                    working_s=every if decision is not None and decision.run else 0.0,
                    samples=samples - last_samples,
                    gpu_temp_c=reading.gpu_temp_c if reading else None,
                    cpu_temp_c=reading.cpu_temp_c if reading else None,
                )
                last_samples = samples
        finally:
            if self.history is not None:
                self.history.close()

    def _samples_done(self) -> int:
        return self.server.samples_done() if self.server is not None else 0

    def _history_since(self, since: float) -> dict[str, Any]:
        if self.history is None:
            return {"hours": [], "temperatures": []}
        return {
            "hours": self.history.per_hour(since),
            "temperatures": self.history.temperatures(since),
        }

    def _prefs(self) -> Any:
        assert self.control is not None
        return self.control.preferences

    async def _join(self, nursery: trio.Nursery, project: str) -> None:
        assert self.peer is not None
        peer, opts = self.peer, self.options
        signed = await find_manifest(peer, project, PinStore(opts.data_dir / "pinned-owners.json"))
        manifest = signed.manifest
        uids = list(manifest.model.expert_uids())
        coverage: dict[str, int] = {}

        async def count(uid: str) -> None:
            announcers = await peer.dht.announcers(expert_key(project, uid))
            coverage[uid] = sum(1 for r in announcers.values() if _serving(r.value))

        async with trio.open_nursery() as lookups:
            for uid in uids:
                lookups.start_soon(count, uid)
        order = list(uids)
        random.Random(self.identity.public_key).shuffle(order)  # volunteers spread out
        chosen = choose_experts(coverage, opts.experts, order)
        _, backends = await join_project(peer, project, chosen, data_dir=opts.data_dir)
        self.server = await nursery.start(
            ExpertServer(peer, backends, ServerConfig(project=project, require_receipts=True)).run
        )
        self.sender = await start_contributing(
            nursery, peer, project, manifest, backends, self.server, opts.data_dir
        )
        log.info("serving %s of project %s", ", ".join(chosen), manifest.project.name)


def _serving(value: bytes) -> bool:
    try:
        return ExpertAnnouncement.decode(value).state == SERVING
    except Exception:  # noqa: BLE001 - checked on the way in
        return False
