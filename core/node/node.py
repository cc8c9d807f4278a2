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
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import psutil
import torch
import trio

from core.control.limits import check_project_id
from core.control.models import (
    Credit,
    Lifetime,
    PreferencesEvent,
    ProjectSummary,
    StateEvent,
    Status,
)
from core.control.models import History as HistoryModel
from core.control.preferences import Preferences
from core.namespaces import moehome_validator
from core.node.compute_device import ComputeDevice, Machine, decide, describe, this_machine
from core.node.control_server import serve_control
from core.node.device import DeviceFigures
from core.node.events import EventLog
from core.node.governor import Governor
from core.node.history import History
from core.node.options import NodeOptions
from core.node.peer_cache import PeerCache, default_bootstrap_peers
from core.node.preferences import PreferenceStore
from core.node.probes import Probes, probe_for_this_os
from core.node.serving import ProjectService, project_summary
from core.node.status import NodeSnapshot, build_status, reason_code
from core.node.throttle import Decision
from core.project.distribution import ProjectNotFound, find_manifest, list_projects
from core.project.pins import PinStore
from net import DhtError, Identity, Peer, RpcConfig, network_config, running_last
from net.transport import DEFAULT_LISTEN

__all__ = ["Node", "NodeOptions"]

log = logging.getLogger(__name__)

#: What a volunteer's node relays for others at most, all circuits together (bytes/s):
#: 1 MiB/s, a share of a home uplink (10-50 Mbit/s) that leaves the rest to its owner.
VOLUNTEER_RELAY_RATE = 1024 * 1024


def memory_in_use() -> int:
    """This process's resident memory, plus what torch holds on the GPUs (bytes)."""
    used = psutil.Process().memory_info().rss
    if torch.cuda.is_available():
        used += sum(torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count()))
    return int(used)


#: Every IPv4 interface, on a port chosen at start (IPv6 comes with the NAT work).
NETWORK_LISTEN = ("/ip4/0.0.0.0/tcp/0",)
#: How long a join waits for the peers of an invite, then for the project's manifest.
MEET_TIMEOUT_S = 15.0
FIND_TIMEOUT_S = 30.0


@dataclass
class Node:
    identity: Identity
    options: NodeOptions
    probes: Probes = field(default_factory=probe_for_this_os)
    #: What torch and the hardware offer to compute on (a test's own in tests).
    machine: Machine = field(default_factory=this_machine)
    started: float = field(default_factory=time.time)
    #: Owned by the node: the governor and the control API read them from here.
    preferences: PreferenceStore = field(init=False)
    events: EventLog = field(default_factory=EventLog)
    peer_cache: PeerCache = field(init=False)
    device: DeviceFigures = field(init=False)
    control_url: str = ""
    # the parts that live while run() runs
    peer: Peer | None = None
    governor: Governor | None = None
    serving: ProjectService | None = None
    history: History | None = None
    _nursery: trio.Nursery | None = None
    #: The serving counters when the history last recorded them: what came since is added
    #: to the history's totals when asked, so the two token counts shown never disagree.
    _recorded_samples: int = 0
    _recorded_accepted: int = 0

    def __post_init__(self) -> None:
        self.preferences = PreferenceStore(self.options.config_dir / "preferences.json")
        self.peer_cache = PeerCache(self.options.data_dir / "peers.json")
        self._default_threads = torch.get_num_threads()
        self.device = DeviceFigures(
            self.options.data_dir / "device-benchmark.json",
            self.events,
            quick=self.options.quick_benchmark,
        )

    # ------------------------------------------------------------ status

    def status(self) -> Status:
        return build_status(self.snapshot())

    def compute_device(self) -> ComputeDevice:
        """What the node computes on: the device of the project it serves, else the one
        the volunteer's GPUs preference gives."""
        plan = self.serving.device_plan if self.serving else None
        if plan is not None:
            return describe(self.machine, plan.device)
        return decide(self.machine, self.preferences.current.gpus)

    def snapshot(self) -> NodeSnapshot:
        governor, serving = self.governor, self.serving
        monitor = self.peer.reachability if self.peer else None
        verdict = monitor.verdict if monitor else None
        snoozed = governor.state.snoozed_until if governor else None
        server = serving.server if serving else None
        return NodeSnapshot(
            project=serving.project if serving else None,
            project_name=serving.project_name if serving else "",
            project_error=serving.project_error if serving else "",
            banned=serving.banned if serving else "",
            contributions_problem=serving.contributions_problem() if serving else "",
            serving=server is not None,
            experts={u: b.version for u, b in server.backends.items()} if server else {},
            decision=governor.decision if governor else None,
            reading=governor.last_reading if governor else None,
            sent=serving.contributions_sent() if serving else 0,
            outcomes=serving.outcomes.copy() if serving else Counter(),
            samples_done=serving.samples_done() if serving else 0,
            device_plan=serving.device_plan if serving else None,
            compute=self.compute_device(),
            memory_used_bytes=memory_in_use(),
            benchmark=self.device.benchmark,
            rtt_ms=self.device.rtt_ms,
            peers=len(self.peer.dht.known_peers()) if self.peer else 0,
            peer_id=str(self.identity.peer_id),
            addresses=tuple(self.peer.addrs()) if self.peer else (),
            lifetime=self._lifetime(),
            credit=serving.credit if serving else Credit(),
            inbound_from_network=(
                self.peer.host.admission_statistics().inbound_from_network if self.peer else 0
            ),
            verdict=verdict.reachability.value if verdict else "unknown",
            observed_ip=verdict.observed_ip if verdict else None,
            relayed=bool(self.peer and self.peer.relay_client and self.peer.relay_client.held),
            port_mapping=(
                None
                if self.peer is None or self.peer.port_mapper is None
                else self.peer.port_mapper.status.error or ""
            ),
            uptime_s=time.time() - self.started,
            snoozed_until=snoozed.timestamp() if snoozed is not None else None,
            pid=os.getpid(),
        )

    # ------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        opts = self.options
        # beyond this computer: learn whether we can be dialled, keep places on relays
        # while we cannot, relay for others while we can if the volunteer allows it
        config = replace(
            network_config(
                opts.listen or self._listen_by_preference(),
                opts.bootstrap,
                relay=self.preferences.current.relay_for_others,
                port_mapping=self.preferences.current.map_port,
            ),
            rpc=RpcConfig(link=opts.link),
        )
        if config.relay is not None:  # a home line: relay at most a share of it
            config = replace(config, relay=replace(config.relay, bytes_per_s=VOLUNTEER_RELAY_RATE))
        # the peer stops last: on the way out the expert server still withdraws its
        # declarations over it (else trainers keep calling a node that is gone)
        peer = Peer(self.identity, config, validator=moehome_validator())
        # a volunteer punches holes (and tells its address) only to the peers of the
        # project it serves (core/node/serving.py), never to whoever opens a circuit
        peer.holepunch.allowed = lambda other: False
        async with running_last(peer):
            self.peer = peer
            await self._run_parts(peer, task_status)

    def _listen_by_preference(self) -> tuple[str, ...]:
        if self.preferences.current.listen_on_network:
            return NETWORK_LISTEN
        return DEFAULT_LISTEN

    async def _run_parts(self, peer: Peer, task_status: trio.TaskStatus[Node]) -> None:
        opts = self.options
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            governor = Governor(
                self.probes, lambda: self.preferences.current, None, on_change=self._decided
            )
            self.governor = governor
            self.preferences.subscribe(lambda _: self.events.publish(PreferencesEvent()))
            self.preferences.subscribe(self._use_threads)
            self._use_threads(self.preferences.current)
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
            nursery.start_soon(self._keep_peers)
            if opts.benchmark:
                self.device.measure(nursery)
            project = opts.project or self.serving.remembered()
            if project:
                self.serving.join(project)
            self._say_device()
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
            return [project_summary(signed) for signed in await list_projects(self.peer)]
        return []

    async def find_project(self, project: str, peers: Sequence[str] = ()) -> ProjectSummary:
        """The project's verified manifest, summed up; looked for through ``peers`` (an
        invite's) and the peers already known. ProjectNotFound says why it was not found."""
        assert self.peer is not None, "the node is not running"
        check_project_id(project)
        await self._meet(peers)
        if not self.peer.dht.known_peers():
            raise ProjectNotFound(
                "this computer knows no peers of the swarm yet: paste an invite link "
                "(it lists peers to start from)"
            )
        pins = PinStore(self.options.data_dir / "pinned-owners.json")
        with trio.move_on_after(FIND_TIMEOUT_S):
            return project_summary(await find_manifest(self.peer, project, pins))
        raise ProjectNotFound(
            f"no answer about project {project} within {FIND_TIMEOUT_S:.0f} s; "
            "check the invite, or try again later"
        )

    async def join(self, project: str, peers: Sequence[str] = ()) -> ProjectSummary:
        """Serve ``project`` from now on (leaving the one served now; remembered), once
        its signed manifest has been found and verified."""
        summary = await self.find_project(project, peers)
        serving = self._serving()
        serving.join(project)
        serving.project_name = serving.project_name or summary.name  # shown at once
        return summary

    async def _meet(self, peers: Sequence[str]) -> None:
        """Connect to ``peers`` and learn the swarm from them; those that answered go
        into the peer cache."""
        if not peers:
            return
        assert self.peer is not None
        try:
            await self.peer.dht.bootstrap(list(peers), timeout=MEET_TIMEOUT_S)
        except DhtError as exc:
            if not self.peer.dht.known_peers():
                raise ProjectNotFound(
                    f"none of the {len(peers)} peer(s) in the invite answered: they may "
                    "have gone, or this computer cannot reach them"
                ) from exc
            log.info("%s; going on with the peers already known", exc)
        self._save_peers()

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

    def _say_device(self) -> None:
        """The device in the log; a GPU left unused as a warning, not quietly."""
        compute = self.compute_device()
        if compute.warning:
            log.warning("computing on the %s: %s", compute.line, compute.warning)
        else:
            log.info("computing on the %s", compute.line)

    def _use_threads(self, prefs: Preferences) -> None:
        """The volunteer's cap on processor threads (process-wide: torch's intra-op pool)."""
        wanted = prefs.cpu_threads or self._default_threads
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)
            log.info("computing with %d processor threads", wanted)

    def _save_peers(self) -> None:
        """Remember the peers of the routing table (their full addresses)."""
        assert self.peer is not None
        host = self.peer.host
        addrs = [
            f"{addr}/p2p/{peer_id}"
            for peer_id in self.peer.dht.known_peers()
            for addr in host.known_addrs(peer_id)[:2]
        ]
        self.peer_cache.remember(addrs)

    async def _keep_peers(self, every: float = 60.0) -> None:
        """Start from the peers met before and the default ones (in the background: a
        stale cache must not hold up the node), then save the peers met now and then."""
        assert self.peer is not None
        start = [
            a
            for a in [*self.peer_cache.load(), *default_bootstrap_peers(self.options.config_dir)]
            if a not in self.options.bootstrap
        ]
        if start:
            try:
                await self.peer.dht.bootstrap(start, timeout=MEET_TIMEOUT_S)
            except DhtError as exc:
                log.info("no peer met before answers (%s)", exc)
        while True:
            self._save_peers()
            await trio.sleep(every)

    def _unrecorded(self) -> tuple[int, int]:
        """Tokens computed and contributions accepted since the history's last record."""
        if self.serving is None:
            return 0, 0
        return (
            max(0, self.serving.samples_done() - self._recorded_samples),
            max(0, self.serving.outcomes["accepted"] - self._recorded_accepted),
        )

    def _lifetime(self) -> Lifetime:
        """The history's totals and what came since its last record (recorded every 10 s)."""
        if self.history is None:
            return Lifetime()
        recorded = self.history.lifetime()
        samples, accepted = self._unrecorded()
        return recorded.model_copy(
            update={
                "samples": recorded.samples + samples,
                "contributions_accepted": recorded.contributions_accepted + accepted,
            }
        )

    def _record_work(self, every: float) -> None:
        """One record of the history: what the last ``every`` seconds gave."""
        assert self.history is not None
        samples, accepted = self._unrecorded()
        serving = self.serving is not None and self.serving.server is not None
        reading = self.governor.last_reading if self.governor else None
        decision = self.governor.decision if self.governor else None
        self.history.record(
            time.time(),
            # donated time: allowed to work, and serving a project
            working_s=every if decision is not None and decision.run and serving else 0.0,
            samples=samples,
            gpu_temp_c=reading.gpu_temp_c if reading else None,
            cpu_temp_c=reading.cpu_temp_c if reading else None,
            gpu_util=reading.gpu_utilization if reading else None,
            accepted=accepted,
        )
        self._recorded_samples += samples
        self._recorded_accepted += accepted

    async def _record_history(self, every: float = 10.0) -> None:
        """Every ``every`` seconds: allowed-to-work time, samples done, temperatures."""
        try:
            while True:
                await trio.sleep(every)
                self._record_work(every)
        finally:
            if self.history is not None:
                self.history.close()
