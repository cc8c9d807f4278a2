"""The volunteer's node: one process that joins the swarm (and a project), serves the
experts the swarm covers least, sends contributions, pulls new versions, obeys the
throttle, and answers the local control API. A project can be joined and left while the
node runs; the choice survives a restart."""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from core.contributing.attacks import Attack
from core.contributing.sender import ContributionSender
from core.contributing.wiring import start_contributing
from core.control.limits import check_project_id
from core.control.models import (
    BenchmarkEvent,
    ContributionEvent,
    ErrorEvent,
    ExpertsEvent,
    PreferencesEvent,
    ProjectEvent,
    ProjectSummary,
    StateEvent,
    Status,
)
from core.control.models import History as HistoryModel
from core.errors import UserFacingError, one_line
from core.experts.records import SERVING, ExpertAnnouncement, expert_key
from core.experts.server import ExpertServer, ServerConfig
from core.files import replace_file
from core.namespaces import moehome_validator
from core.node.bench import cached_benchmark, network_rtt_ms
from core.node.capacity import (
    DevicePlan,
    experts_that_fit,
    graph_cache_bytes,
    parameter_count,
    plan_device,
)
from core.node.choice import choose_experts, rebalance
from core.node.control_server import serve_control
from core.node.events import EventLog
from core.node.governor import Governor
from core.node.history import History
from core.node.preferences import PreferenceStore
from core.node.probes import Probes, probe_for_this_os
from core.node.status import NodeSnapshot, build_status, reason_code
from core.node.throttle import Decision
from core.project.distribution import find_manifest, list_projects
from core.project.manifest import Manifest
from core.project.pins import PinStore
from core.project.publish import join_project
from net import Identity, Peer, PeerConfig, RpcConfig, running_last
from net.host import DEFAULT_LISTEN

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeOptions:
    data_dir: Path
    config_dir: Path
    #: Project to serve; None: the one joined last time (through the control API), if any.
    project: str | None = None
    bootstrap: Sequence[str] = ()
    listen: Sequence[str] = DEFAULT_LISTEN
    #: Most experts to serve; None: as many as fit in the memory the volunteer allows.
    experts: int | None = None
    control_port: int = 0
    #: Seconds between looks at the swarm's coverage (with +-20% jitter).
    rebalance_every: float = 300.0
    #: Measure the device at start (cached); off in tests that do not need it.
    benchmark: bool = True
    #: Also when asked to measure again (tests; the full run takes ~10 s on a CPU).
    quick_benchmark: bool = False
    #: Seconds between retries after a failed join (doubles up to 10 minutes).
    join_retry: float = 15.0
    #: Demo and tests only: poison the contributions this node sends (core.contributing.attacks).
    attack: str | None = None
    #: Demo and tests only: answer every request this many seconds late (a slow link).
    reply_delay: float = 0.0


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
    #: Owned by the node: the governor and the control API read them from here.
    preferences: PreferenceStore = field(init=False)
    events: EventLog = field(default_factory=EventLog)
    control_url: str = ""
    history: History | None = None
    project: str | None = None
    project_name: str = ""
    project_error: str = ""
    device_plan: DevicePlan | None = None
    benchmark: dict[str, Any] = field(default_factory=dict)
    rtt_ms: float | None = None
    rebalances: int = 0
    # totals over every server and sender this node ran (a rebalance starts new ones)
    _samples_before: int = 0
    _sent_before: int = 0
    _outcomes: Counter[str] = field(default_factory=Counter)
    _nursery: trio.Nursery | None = None
    _benchmarking: bool = False
    _project_scope: trio.CancelScope | None = None

    # ------------------------------------------------------------ status

    def status(self) -> Status:
        return build_status(self.snapshot())

    def snapshot(self) -> NodeSnapshot:
        governor = self.governor
        snoozed = governor.state.snoozed_until if governor else None
        return NodeSnapshot(
            project=self.project,
            project_name=self.project_name,
            project_error=self.project_error,
            serving=self.server is not None,
            experts={u: b.version for u, b in self.server.backends.items()} if self.server else {},
            decision=governor.decision if governor else None,
            reading=governor.last_reading if governor else None,
            sent=self._sent_before + (self.sender.stats.sent if self.sender else 0),
            outcomes=Counter(self._outcomes),
            samples_done=self._samples_done(),
            device_plan=self.device_plan,
            benchmark=self.benchmark,
            rtt_ms=self.rtt_ms,
            peers=len(self.peer.dht.known_peers()) if self.peer else 0,
            peer_id=str(self.identity.peer_id),
            uptime_s=time.time() - self.started,
            snoozed_until=snoozed.timestamp() if snoozed is not None else None,
            pid=os.getpid(),
        )

    # ------------------------------------------------------------ commands (control API)

    def pause(self) -> None:
        self._governor().pause()

    def resume(self) -> None:
        self._governor().resume()

    def snooze(self, seconds: float) -> None:
        self._governor().snooze(seconds)

    async def settle(self) -> None:
        await self._governor().step()

    def _governor(self) -> Governor:
        assert self.governor is not None, "the node is not running"
        return self.governor

    # ------------------------------------------------------------ lifecycle

    def __post_init__(self) -> None:
        self.preferences = PreferenceStore(self.options.config_dir / "preferences.json")

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
            await self._run_services(task_status)

    async def _run_services(self, task_status: trio.TaskStatus[Node]) -> None:
        opts = self.options
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.governor = Governor(
                self.probes, lambda: self.preferences.current, None, on_change=self._decided
            )
            self.preferences.subscribe(lambda _: self.events.publish(PreferencesEvent()))
            await nursery.start(self.governor.run)
            self.control_url = await nursery.start(
                partial(serve_control, self, opts.data_dir, port=opts.control_port)
            )
            self.history = History(opts.data_dir / "history.sqlite")
            nursery.start_soon(self._record_history)
            nursery.start_soon(self._measure_network)
            if opts.benchmark:
                self._benchmarking = True
                nursery.start_soon(self._benchmark)
            project = opts.project or self._saved_project()
            if project:
                self.join(project)
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

    def join(self, project: str) -> None:
        """Serve ``project`` from now on (leaving the one served now); remembered."""
        check_project_id(project)  # ValueError with the rule
        if project == self.project and self._project_scope is not None:
            return
        self.leave(remember=False)
        assert self._nursery is not None
        self.project, self.project_error = project, ""
        self._save_project(project)
        scope = trio.CancelScope()
        self._project_scope = scope
        self._nursery.start_soon(self._serve_project, project, scope)
        self.events.publish(ProjectEvent(project=project, joined=True))

    def leave(self, remember: bool = True) -> None:
        """Stop serving the project (declarations are withdrawn on the way out)."""
        if self._project_scope is not None:
            self._project_scope.cancel()
            self._project_scope = None
            self.events.publish(ProjectEvent(project=self.project, joined=False))
        self.project, self.project_name, self.project_error = None, "", ""
        if remember:
            self._save_project(None)

    # ------------------------------------------------------------ serving a project

    async def _serve_project(self, project: str, scope: trio.CancelScope) -> None:
        delay = self.options.join_retry
        with scope:
            while True:
                try:
                    await self._serve_until_rebalanced(project)
                    return  # pragma: no cover - only returns through cancellation
                except Exception as exc:
                    self.project_error = one_line(exc)
                    log.warning(
                        "cannot serve project %s: %s; retrying in %.0f s",
                        project,
                        self.project_error,
                        delay,
                        exc_info=not isinstance(exc, UserFacingError),
                    )
                    self.events.publish(ErrorEvent(message=self.project_error))
                    await trio.sleep(delay)
                    delay = min(delay * 2, 600.0)

    async def _serve_until_rebalanced(self, project: str) -> None:
        """Serve the least covered experts that fit; now and then look at the coverage and,
        when another set helps more, hand over: flush what was accumulated, withdraw,
        and serve the new set."""
        assert self.peer is not None
        assert self.governor is not None
        signed = await find_manifest(
            self.peer, project, PinStore(self.options.data_dir / "pinned-owners.json")
        )
        manifest = signed.manifest
        self.project_name = manifest.project.name
        uids = list(manifest.model.expert_uids())
        order = list(uids)
        random.Random(self.identity.public_key).shuffle(order)  # volunteers spread out
        capacity = self._capacity(manifest)
        chosen = choose_experts(await self._coverage(project, uids), capacity, order)
        while True:
            if not chosen:
                raise MemoryError(
                    "not even one expert fits in the memory you allow "
                    f"({self.device_plan.why if self.device_plan else '?'})"
                )
            assert self.device_plan is not None
            _, backends = await join_project(
                self.peer,
                project,
                chosen,
                data_dir=self.options.data_dir,
                device=self.device_plan.device,
                graph_cache_bytes=graph_cache_bytes(self.device_plan.budget_bytes, len(chosen)),
            )
            decision = self.governor.decision
            server = ExpertServer(
                self.peer,
                backends,
                ServerConfig(
                    project=project,
                    require_receipts=True,
                    trainers=frozenset(bytes.fromhex(t.key) for t in manifest.trainers),
                ),
                paused=decision is None or not decision.run,
            )
            sender: ContributionSender | None = None
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(server.run)
                    sender = await start_contributing(
                        nursery,
                        self.peer,
                        project,
                        manifest,
                        backends,
                        server,
                        self.options.data_dir,
                        on_result=self._contribution_ended,
                        attack=Attack(self.options.attack) if self.options.attack else None,
                    )
                    self.server, self.sender, self.project_error = server, sender, ""
                    await self.governor.attach(server)
                    self.events.publish(ExpertsEvent(experts=sorted(chosen)))
                    log.info("serving %s of project %s", ", ".join(chosen), manifest.project.name)
                    chosen = await self._wait_for_better(project, uids, chosen, order, manifest)
                    if sender is not None:
                        for uid in backends:  # gradients of the old set still count
                            await sender.flush(uid)
                        with trio.move_on_after(30):  # let the deliveries finish
                            await sender.delivered()
                    nursery.cancel_scope.cancel()
            finally:
                # only now: the server has withdrawn its declarations on its way out
                self.governor.detach()
                self._samples_before += server.samples_done()
                self._sent_before += sender.stats.sent if sender is not None else 0
                self.server = self.sender = None
            self.rebalances += 1

    async def _wait_for_better(
        self,
        project: str,
        uids: list[str],
        serving: list[str],
        order: list[str],
        manifest: Manifest,
    ) -> list[str]:
        """Returns a better set of experts once the coverage calls for one."""
        every = self.options.rebalance_every
        while True:
            await trio.sleep(every * random.uniform(0.8, 1.2))
            coverage = await self._coverage(project, uids)
            # our own declarations are withdrawn while paused: count us as serving
            for uid in serving:
                coverage[uid] = max(coverage.get(uid, 0), 1)
            better = rebalance(serving, coverage, self._capacity(manifest), order)
            if set(better) != set(serving):
                log.info("rebalancing: %s -> %s", sorted(serving), sorted(better))
                return better

    async def _coverage(self, project: str, uids: list[str]) -> dict[str, int]:
        """How many volunteers declare each expert (including this node)."""
        assert self.peer is not None
        peer = self.peer
        coverage: dict[str, int] = {}

        async def count(uid: str) -> None:
            announcers = await peer.dht.announcers(expert_key(project, uid))
            coverage[uid] = sum(1 for r in announcers.values() if _serving(r.value))

        async with trio.open_nursery() as lookups:
            for uid in uids:
                lookups.start_soon(count, uid)
        return coverage

    def _capacity(self, manifest: Manifest) -> int:
        prefs = self.preferences.current
        self.device_plan = plan_device(prefs.gpus, prefs.memory_cap_gb)
        spec = manifest.model.expert.spec()
        return experts_that_fit(
            parameter_count(spec),
            spec.torch_dtype.itemsize,
            self.device_plan.budget_bytes,
            self.options.experts,
        )

    # ------------------------------------------------------------ events and figures

    def _decided(self, decision: Decision) -> None:
        self.events.publish(
            StateEvent(
                run=decision.run, reason=decision.describe(), reason_code=reason_code(decision)
            )
        )

    def _contribution_ended(self, uid: str, outcome: str) -> None:
        self._outcomes[outcome] += 1
        self.events.publish(ContributionEvent(uid=uid, outcome=outcome))

    async def _benchmark(self, force: bool = False) -> None:
        cache = self.options.data_dir / "device-benchmark.json"
        token = trio.lowlevel.current_trio_token()

        def progress(what: str, done: int, total: int) -> None:  # from the worker thread
            event = BenchmarkEvent(what=what, done=done, total=total)
            token.run_sync_soon(self.events.publish, event)

        try:
            self.benchmark = await trio.to_thread.run_sync(
                partial(
                    cached_benchmark,
                    cache,
                    force=force,
                    quick=self.options.quick_benchmark or not force,
                    progress=progress,
                )
            )
        finally:
            self._benchmarking = False
        self.events.publish(BenchmarkEvent(what="done", done=1, total=1, figures=self.benchmark))

    def measure_device(self) -> None:
        """Measure again (the full benchmark), in the background; progress as events."""
        if self._benchmarking:
            return
        assert self._nursery is not None
        self._benchmarking = True
        self._nursery.start_soon(partial(self._benchmark, force=True))

    async def announced_projects(self) -> list[ProjectSummary]:
        """The projects announced in the swarm (what it finds in 20 s)."""
        assert self.peer is not None
        with trio.move_on_after(20):
            return [ProjectSummary.model_validate(p) for p in await list_projects(self.peer)]
        return []

    async def _measure_network(self, every: float = 60.0) -> None:
        """Median round trip to up to five known peers (for the status), every minute
        (every 5 s until some peer answers)."""
        assert self.peer is not None
        while True:
            figures = await network_rtt_ms(self.peer, rounds=1)
            self.rtt_ms = figures["network_rtt_ms_median"]
            await trio.sleep(every if self.rtt_ms is not None else 5.0)

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
                    samples=max(0, samples - last_samples),
                    gpu_temp_c=reading.gpu_temp_c if reading else None,
                    cpu_temp_c=reading.cpu_temp_c if reading else None,
                    gpu_util=reading.gpu_utilization if reading else None,
                )
                last_samples = samples
        finally:
            if self.history is not None:
                self.history.close()

    def _samples_done(self) -> int:
        current = self.server.samples_done() if self.server is not None else 0
        return self._samples_before + current

    def work_history(self, since: float) -> HistoryModel:
        if self.history is None:
            return HistoryModel()
        return HistoryModel(
            hours=self.history.per_hour(since), temperatures=self.history.per_minute(since)
        )

    # ------------------------------------------------------------ the remembered project

    def _state_file(self) -> Path:
        return self.options.config_dir / "node.json"

    def _saved_project(self) -> str | None:
        try:
            project = json.loads(self._state_file().read_text()).get("project")
        except (OSError, ValueError, AttributeError):
            return None
        return project if isinstance(project, str) else None

    def _save_project(self, project: str | None) -> None:
        replace_file(self._state_file(), json.dumps({"project": project}))


def _serving(value: bytes) -> bool:
    try:
        return ExpertAnnouncement.decode(value).state == SERVING
    except Exception:  # noqa: BLE001 - checked on the way in
        return False
