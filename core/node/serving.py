"""Serving a project: join it (the choice is remembered), serve the least covered experts
that fit the memory the volunteer allows, send their contributions, now and then look at
the swarm's coverage and hand over to a better set, leave. A failed join is retried with
a growing delay; its error is what the status says."""

from __future__ import annotations

import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import trio

from core.contributing.sender import ContributionSender
from core.contributing.wiring import start_contributing
from core.control.limits import check_project_id
from core.control.models import (
    ContributionEvent,
    Credit,
    ErrorEvent,
    ExpertsEvent,
    ProjectEvent,
    ProjectSummary,
)
from core.control.preferences import Preferences
from core.errors import UserFacingError, one_line
from core.experts.backend import compute_dtype
from core.experts.records import SERVING, ExpertAnnouncement, expert_key
from core.experts.registry import parameter_count
from core.experts.server import ExpertServer, ServerConfig
from core.files import replace_file
from core.node.capacity import (
    DevicePlan,
    experts_that_fit,
    graph_cache_bytes,
    plan_device,
)
from core.node.choice import choose_experts, rebalance
from core.node.credit import check_credit
from core.node.events import EventLog
from core.node.governor import Governor
from core.node.options import NodeOptions
from core.project.bans import BanBoard
from core.project.distribution import ProjectNotFound, find_manifest
from core.project.joining import join_project
from core.project.keys import fingerprint
from core.project.manifest import Manifest
from core.project.pins import PinStore
from core.project.signed import SignedManifest
from core.project.versions import pull_interval
from core.protocol.bans import Ban
from net import Identity, Peer
from net.identity import peer_id_from_public_key

log = logging.getLogger(__name__)

#: How soon a manifest not found just after a start or a join is looked up again.
LOOK_AGAIN_S = 2.0
#: Experts whose coverage a volunteer looks up when it chooses, besides its own, and
#: how many lookups run at once.
COVERAGE_SAMPLE = 256
COVERAGE_LOOKUPS = 16


def project_summary(signed: SignedManifest) -> ProjectSummary:
    """What a volunteer is shown of a project before joining it."""
    manifest = signed.manifest
    return ProjectSummary(
        project=signed.project_id,
        name=manifest.project.name,
        description=manifest.project.description,
        owner=fingerprint(signed.origin_key),
        experts=manifest.model.expert_count,
        mixture_layers=manifest.model.mixture_layers,
        expert_kind=manifest.model.expert.kind,
        expert_parameters=parameter_count(manifest.model.expert_spec()),
    )


class ProjectService:
    """The project this node serves, and everything that comes with serving it."""

    def __init__(
        self,
        identity: Identity,
        options: NodeOptions,
        peer: Peer,
        governor: Governor,
        preferences: Callable[[], Preferences],
        events: EventLog,
        nursery: trio.Nursery,
    ) -> None:
        self.identity = identity
        self.options = options
        self.peer = peer
        self.governor = governor
        self.preferences = preferences
        self.events = events
        self._nursery = nursery
        self.project: str | None = None
        self.project_name = ""
        self.project_error = ""
        #: why the project banned this node (a trainer or aggregator caught a wrong
        #: answer; core/project/bans.py), "" when it did not
        self.banned = ""
        self.server: ExpertServer | None = None
        self.sender: ContributionSender | None = None
        self.device_plan: DevicePlan | None = None
        self.rebalances = 0
        # totals over every server and sender this node ran (a rebalance starts new ones)
        self._samples_before = 0
        self._sent_before = 0
        self.outcomes: Counter[str] = Counter()
        self._scope: trio.CancelScope | None = None
        #: this node's credit in the project, as its aggregators signed it
        self.credit = Credit()
        #: trio time of the next look at it (kept across rebalances)
        self._credit_due: float | None = None

    def samples_done(self) -> int:
        current = self.server.samples_done() if self.server is not None else 0
        return self._samples_before + current

    def contributions_sent(self) -> int:
        return self._sent_before + (self.sender.stats.sent if self.sender else 0)

    def contributions_problem(self) -> str:
        """Why the work done here does not reach the aggregators now ("" when it does)."""
        return self.sender.problem() if self.sender else ""

    def join(self, project: str) -> None:
        """Serve ``project`` from now on (leaving the one served now); remembered."""
        check_project_id(project)  # ValueError with the rule
        if project == self.project and self._scope is not None:
            return
        self.leave(remember=False)
        self.project, self.project_error, self.banned = project, "", ""
        self.credit, self._credit_due = Credit(), None
        self._save_project(project)
        scope = trio.CancelScope()
        self._scope = scope
        self._nursery.start_soon(self._serve_project, project, scope)
        self.events.publish(ProjectEvent(project=project, joined=True))

    def leave(self, remember: bool = True) -> None:
        """Stop serving the project (declarations are withdrawn on the way out)."""
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None
            self.events.publish(ProjectEvent(project=self.project, joined=False))
        self.project, self.project_name, self.project_error, self.banned = None, "", "", ""
        self.peer.holepunch.allowed = lambda other: False
        if remember:
            self._save_project(None)

    # ------------------------------------------------------------ serving a project

    async def _serve_project(self, project: str, scope: trio.CancelScope) -> None:
        delay = self.options.join_retry
        looking_since = trio.current_time()
        with scope:
            while True:
                try:
                    await self._serve_until_rebalanced(project)
                    return  # pragma: no cover - only returns through cancellation
                except ProjectNotFound as exc:
                    if trio.current_time() - looking_since < self.options.first_look_s:
                        # just started or joined: the swarm is still being reached (every
                        # start of the tray's node showed a red "no valid manifest" for
                        # 15-25 s before it worked); only a longer search is an error
                        log.info("%s; looking again in %.0f s", exc, LOOK_AGAIN_S)
                        await trio.sleep(LOOK_AGAIN_S)
                        continue
                    await self._failed(project, exc, delay)
                    delay = min(delay * 2, 600.0)
                except Exception as exc:  # noqa: BLE001 - any failure is said and retried
                    await self._failed(project, exc, delay)
                    delay = min(delay * 2, 600.0)

    async def _failed(self, project: str, exc: Exception, delay: float) -> None:
        """Say why the project cannot be served (status, tray), wait, and let the caller
        try again."""
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

    async def _serve_until_rebalanced(self, project: str) -> None:
        """Serve the least covered experts that fit; now and then look at the coverage and,
        when another set helps more, hand over: flush what was accumulated, withdraw,
        and serve the new set."""
        signed = await find_manifest(
            self.peer, project, PinStore(self.options.data_dir / "pinned-owners.json")
        )
        manifest = signed.manifest
        self.project_name = manifest.project.name
        # hole punches for the project's trainers and aggregators alone (net/reach/holepunch.py)
        keys = [t.key for t in manifest.trainers] + [a.key for a in manifest.aggregators]
        ours = frozenset(peer_id_from_public_key(bytes.fromhex(k)) for k in keys)
        self.peer.holepunch.allowed = ours.__contains__
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
                    answer_hook=self.options.answer_hook,
                ),
                paused=decision is None or not decision.run,
            )
            sender: ContributionSender | None = None
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(server.run)
                    await nursery.start(self._watch_bans, signed)
                    nursery.start_soon(self._watch_credit, signed)
                    sender = await start_contributing(
                        nursery,
                        self.peer,
                        project,
                        manifest,
                        backends,
                        server,
                        self.options.data_dir,
                        on_result=self._contribution_ended,
                        sums_hook=self.options.sums_hook,
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

    async def _watch_credit(self, signed: SignedManifest) -> None:
        """Now and then, this node's credit as the aggregators sign it (status, tray)."""
        every = self.options.credit_every_s
        while True:
            if self._credit_due is None:
                self._credit_due = trio.current_time() + every
            await trio.sleep_until(self._credit_due)
            self._credit_due = trio.current_time() + every
            try:
                self.credit = await check_credit(
                    self.peer, signed, self.identity.public_key, self.options.data_dir
                )
            except OSError as exc:  # its proof could not be written: said, not fatal
                log.warning("could not keep the credit proof: %s", exc)

    async def _watch_bans(
        self,
        signed: SignedManifest,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Read the project's bans; if one names this node, say why (status, tray)."""
        board = BanBoard(
            self.peer, signed, interval=pull_interval(signed.manifest.training.round_seconds)
        )
        me = str(self.peer.peer_id)

        def seen(ban: Ban) -> None:
            if ban.peer == me:
                until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ban.until))
                self.banned = f"{ban.reason} (until {until})"
                self.events.publish(ErrorEvent(message=f"banned from the project: {self.banned}"))

        board.listeners.append(seen)
        task_status.started()
        await board.run()

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
            coverage = await self._coverage(project, uids, serving)
            # our own declarations are withdrawn while paused: count us as serving
            for uid in serving:
                coverage[uid] = max(coverage.get(uid, 0), 1)
            better = rebalance(serving, coverage, self._capacity(manifest), order)
            if set(better) != set(serving):
                log.info("rebalancing: %s -> %s", sorted(serving), sorted(better))
                return better

    async def _coverage(
        self, project: str, uids: list[str], serving: Sequence[str] = ()
    ) -> dict[str, int]:
        """How many volunteers declare each expert (including this node): the ones
        ``serving`` and at most COVERAGE_SAMPLE others drawn anew each time (a project
        may have tens of thousands of experts; each volunteer's draws differ, so the
        swarm still spreads over all of them), looked up a few at a time."""
        peer = self.peer
        coverage: dict[str, int] = {}
        mine = set(serving)
        others = [u for u in uids if u not in mine]
        sample = [*serving, *random.sample(others, min(len(others), COVERAGE_SAMPLE))]
        limiter = trio.CapacityLimiter(COVERAGE_LOOKUPS)

        async def count(uid: str) -> None:
            async with limiter:
                announcers = await peer.dht.announcers(expert_key(project, uid))
            coverage[uid] = sum(1 for r in announcers.values() if _serving(r.value))

        async with trio.open_nursery() as lookups:
            for uid in sample:
                lookups.start_soon(count, uid)
        return coverage

    def _capacity(self, manifest: Manifest) -> int:
        prefs = self.preferences()
        self.device_plan = plan_device(prefs.gpus, prefs.memory_cap_gb)
        spec = manifest.model.expert_spec()
        return experts_that_fit(
            parameter_count(spec),
            # the weights as held here: a CPU computes 16-bit experts in float32
            compute_dtype(spec.torch_dtype, torch.device(self.device_plan.device)).itemsize,
            self.device_plan.budget_bytes,
            self.options.experts,
            on_gpu=self.device_plan.device != "cpu",
        )

    def _contribution_ended(self, uid: str, outcome: str) -> None:
        self.outcomes[outcome] += 1
        self.events.publish(ContributionEvent(uid=uid, outcome=outcome))

    # ------------------------------------------------------------ the remembered project

    def _state_file(self) -> Path:
        return self.options.config_dir / "node.json"

    def remembered(self) -> str | None:
        """The project joined last time (through the control API), if any."""
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
