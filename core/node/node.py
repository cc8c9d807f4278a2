"""The volunteer's node: one process that joins the swarm (and a project), obeys the
throttle and answers the local control API. Its jobs are parts of their own: the project
it serves (core/node/serving.py), the throttle (governor.py), the device's figures
(device.py), the history (history.py), the preferences and events the API reads
(preferences.py, events.py); the node starts them, owns them and answers for them."""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial

import trio

from core.control.models import History as HistoryModel
from core.control.models import PreferencesEvent, ProjectSummary, StateEvent, Status
from core.namespaces import moehome_validator
from core.node.control_server import serve_control
from core.node.device import DeviceFigures
from core.node.events import EventLog
from core.node.governor import Governor
from core.node.history import History
from core.node.options import NodeOptions
from core.node.preferences import PreferenceStore
from core.node.probes import Probes, probe_for_this_os
from core.node.serving import ProjectService
from core.node.status import NodeSnapshot, build_status, reason_code
from core.node.throttle import Decision
from core.project.distribution import list_projects
from net import Identity, Peer, PeerConfig, RpcConfig, running_last

__all__ = ["Node", "NodeOptions"]

log = logging.getLogger(__name__)


@dataclass
class Node:
    identity: Identity
    options: NodeOptions
    probes: Probes = field(default_factory=probe_for_this_os)
    started: float = field(default_factory=time.time)
    #: Owned by the node: the governor and the control API read them from here.
    preferences: PreferenceStore = field(init=False)
    events: EventLog = field(default_factory=EventLog)
    device: DeviceFigures = field(init=False)
    control_url: str = ""
    # the parts that live while run() runs
    peer: Peer | None = None
    governor: Governor | None = None
    serving: ProjectService | None = None
    history: History | None = None
    _nursery: trio.Nursery | None = None

    def __post_init__(self) -> None:
        self.preferences = PreferenceStore(self.options.config_dir / "preferences.json")
        self.device = DeviceFigures(
            self.options.data_dir / "device-benchmark.json",
            self.events,
            quick=self.options.quick_benchmark,
        )

    # ------------------------------------------------------------ status

    def status(self) -> Status:
        return build_status(self.snapshot())

    def snapshot(self) -> NodeSnapshot:
        governor, serving = self.governor, self.serving
        snoozed = governor.state.snoozed_until if governor else None
        server = serving.server if serving else None
        return NodeSnapshot(
            project=serving.project if serving else None,
            project_name=serving.project_name if serving else "",
            project_error=serving.project_error if serving else "",
            serving=server is not None,
            experts={u: b.version for u, b in server.backends.items()} if server else {},
            decision=governor.decision if governor else None,
            reading=governor.last_reading if governor else None,
            sent=serving.contributions_sent() if serving else 0,
            outcomes=serving.outcomes.copy() if serving else Counter(),
            samples_done=serving.samples_done() if serving else 0,
            device_plan=serving.device_plan if serving else None,
            benchmark=self.device.benchmark,
            rtt_ms=self.device.rtt_ms,
            peers=len(self.peer.dht.known_peers()) if self.peer else 0,
            peer_id=str(self.identity.peer_id),
            uptime_s=time.time() - self.started,
            snoozed_until=snoozed.timestamp() if snoozed is not None else None,
            pid=os.getpid(),
        )

    # ------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        opts = self.options
        config = PeerConfig(
            listen=tuple(opts.listen),
            bootstrap=tuple(opts.bootstrap),
            rpc=RpcConfig(reply_delay=opts.reply_delay),
        )
        # the peer stops last: on the way out the expert server still withdraws its
        # declarations over it (else trainers keep calling a node that is gone)
        peer = Peer(self.identity, config, validator=moehome_validator())
        async with running_last(peer):
            self.peer = peer
            await self._run_parts(peer, task_status)

    async def _run_parts(self, peer: Peer, task_status: trio.TaskStatus[Node]) -> None:
        opts = self.options
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            governor = Governor(
                self.probes, lambda: self.preferences.current, None, on_change=self._decided
            )
            self.governor = governor
            self.preferences.subscribe(lambda _: self.events.publish(PreferencesEvent()))
            await nursery.start(governor.run)
            self.serving = ProjectService(
                self.identity,
                opts,
                peer,
                governor,
                lambda: self.preferences.current,
                self.events,
                nursery,
            )
            self.control_url = await nursery.start(
                partial(serve_control, self, opts.data_dir, port=opts.control_port)
            )
            self.history = History(opts.data_dir / "history.sqlite")
            nursery.start_soon(self._record_history)
            nursery.start_soon(self.device.watch_network, peer)
            if opts.benchmark:
                self.device.measure(nursery)
            project = opts.project or self.serving.remembered()
            if project:
                self.serving.join(project)
            log.info("node %s up; control API at %s", self.identity.peer_id, self.control_url)
            task_status.started(self)
            await trio.sleep_forever()

    def stop(self) -> None:
        """Stop the node cleanly: run() returns after the declarations are withdrawn."""
        if self._nursery is not None:
            self._nursery.start_soon(self._stop_soon)

    async def _stop_soon(self) -> None:
        await trio.sleep(0.2)  # the control API answers the shutdown request first
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    # ------------------------------------------------------------ commands (control API)

    def pause(self) -> None:
        self._governor().pause()

    def resume(self) -> None:
        self._governor().resume()

    def snooze(self, seconds: float) -> None:
        self._governor().snooze(seconds)

    async def settle(self) -> None:
        await self._governor().step()

    def join(self, project: str) -> None:
        """Serve ``project`` from now on (leaving the one served now); remembered."""
        self._serving().join(project)

    def leave(self) -> None:
        """Stop serving the project (declarations are withdrawn on the way out)."""
        self._serving().leave()

    def measure_device(self) -> None:
        """Measure again (the full benchmark), in the background; progress as events."""
        assert self._nursery is not None, "the node is not running"
        self.device.measure(self._nursery, force=True)

    async def announced_projects(self) -> list[ProjectSummary]:
        """The projects announced in the swarm (what it finds in 20 s)."""
        assert self.peer is not None
        with trio.move_on_after(20):
            return [ProjectSummary.model_validate(p) for p in await list_projects(self.peer)]
        return []

    def work_history(self, since: float) -> HistoryModel:
        if self.history is None:
            return HistoryModel()
        return HistoryModel(
            hours=self.history.per_hour(since), temperatures=self.history.per_minute(since)
        )

    def _governor(self) -> Governor:
        assert self.governor is not None, "the node is not running"
        return self.governor

    def _serving(self) -> ProjectService:
        assert self.serving is not None, "the node is not running"
        return self.serving

    # ------------------------------------------------------------ events and history

    def _decided(self, decision: Decision) -> None:
        self.events.publish(
            StateEvent(
                run=decision.run, reason=decision.describe(), reason_code=reason_code(decision)
            )
        )

    async def _record_history(self, every: float = 10.0) -> None:
        """Every ``every`` seconds: allowed-to-work time, samples done, temperatures."""
        last_samples = 0
        try:
            while True:
                await trio.sleep(every)
                samples = self.serving.samples_done() if self.serving else 0
                reading = self.governor.last_reading if self.governor else None
                decision = self.governor.decision if self.governor else None
                assert self.history is not None
                self.history.record(
                    time.time(),
                    working_s=every if decision is not None and decision.run else 0.0,
                    samples=max(0, samples - last_samples),
                    gpu_temp_c=reading.gpu_temp_c if reading else None,
                    cpu_temp_c=reading.cpu_temp_c if reading else None,
                    gpu_util=reading.gpu_utilization if reading else None,
                )
                last_samples = samples
        finally:
            if self.history is not None:
                self.history.close()
