"""The volunteer's side of contributions: every N samples or T seconds, the accumulated
parameter gradient of each served expert goes, compressed and signed, with its receipts,
to the aggregator responsible for the expert. Retried with backoff; a retry carries the
same nonce, so an aggregator never counts one contribution twice."""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import trio

from core.contributing.codecs import ErrorFeedback, codec
from core.contributing.reveal import Reveal
from core.experts.backend import ExpertBackend, GradientAccumulator
from core.experts.kept import KeptBudget
from core.experts.wire import to_wire
from core.protocol.aggregator_methods import CONTRIBUTE, REVEAL, responsible_aggregator
from core.protocol.contributions import CARRY_HORIZON_S, Contribution, ParamSpec
from core.protocol.refusals import (
    COME_BACK_LATER,
    WAITING,
    Refusal,
    in_words,
    is_offence,
    pause_after,
)
from net import Peer, PeerID, RemoteError, RpcError, TooLarge

log = logging.getLogger(__name__)

#: Alters an expert's gradient sums over ``samples`` before they are sent: (uid, sums,
#: samples) -> the sums sent. Only the rig sets one (core/demo/attacks.py, to show the
#: aggregators' robust rules at work); an honest node sends what it computed.
SumsHook = Callable[[str, dict[str, torch.Tensor], int], dict[str, torch.Tensor]]

#: after the project banned this volunteer (an aggregator refused it so), how long the
#: sender waits before it tries again: bans last hours, and every contribution until
#: then would be refused (the node's status says why, core/project/bans.py)
BANNED_PAUSE_SECONDS = 600.0


@dataclass(frozen=True)
class SenderConfig:
    project: str
    codec: str = "fp16"
    every_samples: int = 512
    every_seconds: float = 30.0
    retry_initial: float = 1.0
    retry_max: float = 60.0
    give_up_after: float = 3600.0
    #: bytes of backward requests' inputs and output gradients kept so that a
    #: contribution can be revealed when an aggregator audits it (0: none kept, and an
    #: audited contribution is discarded)
    kept_bytes: int = 0
    #: how long a reveal is tried (the aggregator discards an audited contribution whose
    #: reveal does not come)
    reveal_seconds: float = 120.0
    #: the manifest's round_seconds: after a refusal that says "come back later", an
    #: expert's gradients wait this long (doubling while it repeats, core/protocol/refusals.py)
    round_seconds: float = 60.0
    #: an aggregator that has not answered for this long is "unreachable" in the status
    unreachable_after: float = 30.0


@dataclass
class SenderStatistics:
    sent: int = 0
    accepted: int = 0
    retries: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    given_up: int = 0
    #: contributions an aggregator audited, those revealed, and those we could not
    #: reveal (their tensors did not fit the budget or the call)
    audited: int = 0
    revealed: int = 0
    unrevealable: int = 0
    #: contributions dropped unsent: their expert's round had enough of ours and waited
    #: for other volunteers, or the aggregator could not be reached
    held_back: int = 0


@dataclass
class _Kept:
    """What an audit of a contribution in flight may ask for."""

    reveal: Reveal | None  # None: not everything behind it was kept
    nbytes: int  # of the kept budget, given back when the contribution is settled


#: how long before its round closes a contribution is sent, before a delivery was timed
DEFAULT_LEAD_S = 2.0
#: added to the timed delivery: the send loop's tick, the aggregator's round loop's
LEAD_SLACK_S = 1.0
#: a round said to close further off than this is not believed
MAX_CLOSES_IN_S = 86_400.0


def contribution_due(
    samples: int,
    seconds_since_last: float,
    config: SenderConfig,
    seconds_to_close: float | None = None,
) -> bool:
    """Send when ``every_samples`` are in (a busy expert sends in bounded pieces); else,
    when some are, once the expert's round closes within a delivery's time
    (``seconds_to_close`` <= 0: what was computed until then joins that round rather than
    the next, and one contribution a round is sent instead of one every
    ``every_seconds``); while when it closes is unknown (None), once the last send is
    ``every_seconds`` old."""
    if samples <= 0:
        return False
    if samples >= config.every_samples:
        return True
    if seconds_to_close is None:
        return seconds_since_last >= config.every_seconds
    return seconds_to_close <= 0


def close_ahead(
    told: float | None, served: float | None, now: float, lead: float, round_seconds: float
) -> tuple[float, float] | None:
    """(when the expert's round closes next, seconds until its last contribution is due:
    ``lead`` before) from what its aggregator ``told`` (``next_close``); None when it
    told nothing, or when a delivery takes half a round or more (a send before every
    close would be a send all the time: the regular schedule holds)."""
    if told is None or lead >= round_seconds / 2:
        return None
    close = next_close(told, served, now, round_seconds)
    return close, close - now - lead


def next_close(told: float, served: float | None, now: float, round_seconds: float) -> float:
    """When an expert's round closes next: ``told`` (the aggregator said so, in this
    clock), or as many rounds after it as have passed since, on the aggregator's beat
    (core/aggregator/core.py ``round_began``); past one a contribution was already sent
    just before (``served``)."""
    close = told
    if close < now:
        close += math.ceil((now - close) / round_seconds) * round_seconds
    while served is not None and close <= served + round_seconds / 2:
        close += round_seconds
    return close


class ContributionSender:
    def __init__(
        self,
        peer: Peer,
        backends: Mapping[str, ExpertBackend],
        aggregators: Sequence[PeerID],
        config: SenderConfig,
        *,
        on_result: Callable[[str, str], None] | None = None,
        sums_hook: SumsHook | None = None,
        assignment: Mapping[str, int] | None = None,
    ) -> None:
        """``assignment``: the manifest's experts to aggregators
        (core/project/assignment.py); without it, by hashing the uid."""
        if not aggregators:
            raise ValueError("a project needs at least one aggregator to send contributions to")
        self.peer = peer
        self.backends = backends
        self.aggregators = list(aggregators)
        self.assignment = dict(assignment or {})
        self.config = config
        self.stats = SenderStatistics()
        # told (uid, "accepted" | a refusal code | "given_up") when a delivery ends
        self.on_result = on_result
        self.sums_hook = sums_hook  # the rig only: alter what is sent
        self._in_flight = 0
        self._all_delivered = trio.Event()
        self._all_delivered.set()
        self._feedback = {uid: ErrorFeedback() for uid in backends}
        #: per expert, the nonce of the contribution whose residual the feedback holds,
        #: and that contribution with its parts (revealed with the next one's audit)
        self._carried_from: dict[str, bytes] = {}
        self._last: dict[str, tuple[Contribution, list[torch.Tensor]]] = {}
        self.kept_budget = KeptBudget(config.kept_bytes) if config.kept_bytes > 0 else None
        #: trio time until which nothing is sent (the project banned us)
        self.paused_until = 0.0
        for backend in backends.values():
            backend.kept_budget = self.kept_budget
        self._nursery: trio.Nursery | None = None
        self._since: dict[str, float] = {}  # uid -> trio time of its last send
        #: per expert: trio time until which its gradients are not sent (a refusal said
        #: to come back later), how many such refusals came in a row, and the last one
        self._quiet_until: dict[str, float] = {}
        self._quiet_repeats: Counter[str] = Counter()
        self.quiet_reason: dict[str, str] = {}
        #: the refusal code behind each quiet expert (its words come from refusals.in_words)
        self.quiet_code: dict[str, str] = {}
        #: per aggregator: trio time before which it is not called again (it did not
        #: answer; one back-off for every delivery, not one dial per contribution), the
        #: back-off's current step, and since when it has not answered
        self._down_until: dict[PeerID, float] = {}
        self._down_delay: dict[PeerID, float] = {}
        self._silent_since: dict[PeerID, float] = {}
        #: called with an expert whose weights are behind the aggregator's (a
        #: contribution refused as stale, or a reply naming a newer version): pull now
        self.on_stale: Callable[[str], None] | None = None
        #: called with an expert and (trio time) when its round closes, once this
        #: volunteer sent its last contribution to it: the new version is due then
        self.on_round_close: Callable[[str, float], None] | None = None
        #: per expert: (trio time) when its round closes, as its aggregator last said;
        #: the close a contribution was last sent just before; how long a delivery
        #: takes (timed, smoothed), so that a send lands before the close
        self._closes_at: dict[str, float] = {}
        self._served_close: dict[str, float] = {}
        self._delivery_s: dict[str, float] = {}

    async def run(
        self, *, task_status: trio.TaskStatus[ContributionSender] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            started = trio.current_time()
            task_status.started(self)
            while True:
                for uid, backend in self.backends.items():
                    now = trio.current_time()
                    since = self._since.get(uid, started)
                    samples = sum(a.samples for _, a in backend.accumulators())
                    ahead = close_ahead(
                        self._closes_at.get(uid),
                        self._served_close.get(uid),
                        now,
                        self._lead(uid),
                        self.config.round_seconds,
                    )
                    to_close = None if ahead is None else ahead[1]
                    if contribution_due(samples, now - since, self.config, to_close):
                        self._since[uid] = now
                        if ahead is not None and ahead[1] <= 0:  # this close is served
                            self._served_close[uid] = ahead[0]
                            if self.on_round_close is not None:
                                self.on_round_close(uid, ahead[0])
                        await self._send_all(uid, backend, nursery)
                await trio.sleep(0.5)

    def _lead(self, uid: str) -> float:
        """How long before a round's close its last contribution is sent."""
        return self._delivery_s.get(uid, DEFAULT_LEAD_S - LEAD_SLACK_S) + LEAD_SLACK_S

    def _heard(self, uid: str, meta: Mapping[str, Any], began: float, first_try: bool) -> None:
        """What an accepting reply says beyond "accepted": when the round closes (old
        aggregators do not say), and the aggregator's version (ours behind: pull)."""
        now = trio.current_time()
        closes_in = meta.get("closes_in")
        if (
            isinstance(closes_in, int | float)
            and not isinstance(closes_in, bool)
            and 0 <= closes_in <= MAX_CLOSES_IN_S
        ):
            self._closes_at[uid] = now + closes_in
        if first_try:  # a retried delivery times the aggregator's absence, not the path
            took = now - began
            last = self._delivery_s.get(uid)
            self._delivery_s[uid] = took if last is None else 0.7 * last + 0.3 * took
        version = meta.get("version")
        backend = self.backends.get(uid)
        if (
            isinstance(version, int)
            and not isinstance(version, bool)
            and backend is not None
            and version > backend.version
            and self.on_stale is not None
        ):
            self.on_stale(uid)

    async def flush(self, uid: str) -> None:
        """Send what ``uid`` accumulated now (before its weights change: a contribution is
        tied to the version its gradients were computed on). Delivery goes on in the
        background; this returns once the accumulator is emptied."""
        if self._nursery is None:
            raise RuntimeError("the sender is not running")
        self._since[uid] = trio.current_time()
        await self._send_all(uid, self.backends[uid], self._nursery)

    async def _send_all(self, uid: str, backend: ExpertBackend, nursery: trio.Nursery) -> None:
        """A contribution from each accumulator of ``uid`` that holds gradients (those of
        the previous weights, then the current ones': one contribution per version)."""
        target = responsible_aggregator(uid, self.aggregators, self.assignment)
        now = trio.current_time()  # a delivery is timed from here: building is part of it
        hold_back = now < self._quiet_until.get(uid, 0.0) or now < self._down_until.get(target, 0.0)
        for module, accumulator in backend.accumulators():
            if self.banned or hold_back:  # what was computed meanwhile is dropped
                if hold_back and accumulator.samples:
                    self.stats.held_back += 1
                accumulator.take_all()[3].drop(self.kept_budget)
                continue
            built = await trio.to_thread.run_sync(self._build, uid, backend, module, accumulator)
            if built is not None:
                nursery.start_soon(self._deliver, uid, *built, now)

    def _build(
        self,
        uid: str,
        backend: ExpertBackend,
        module: torch.nn.Module,
        accumulator: GradientAccumulator,
    ) -> tuple[Contribution, list[torch.Tensor], _Kept] | None:
        sums, samples, receipts, kept = accumulator.take_all()
        # encoded in host memory, where the codec's residual stays between contributions
        # (a GPU's memory holds the weights and the sums: core/node/capacity.py)
        sums = {name: t.cpu() for name, t in sums.items()}
        if not receipts or not sums:
            kept.drop(self.kept_budget)
            return None
        if self.sums_hook is not None:
            sums = self.sums_hook(uid, sums, samples)
        chosen = codec(self.config.codec)
        names = [n for n, _ in module.named_parameters()]
        feedback = self._feedback[uid]
        carried = self._carried_from.get(uid, b"") if feedback.residuals else b""
        last = self._last.get(uid)
        if carried and (last is None or time.time() - last[0].timestamp > CARRY_HORIZON_S):
            # the aggregator may have forgotten that contribution (its audit of this one
            # could not check the residual), and its residual is of weights long gone
            feedback.residuals.clear()
            carried = b""
        residual = {n: feedback.residuals[n].clone() for n in names} if carried else None
        parts: list[torch.Tensor] = []
        for name in names:
            parts.extend(feedback.compress(name, sums[name], chosen))
        contribution = Contribution.create(
            self.peer.identity,
            project=self.config.project,
            uid=uid,
            base_version=_version_of(receipts, backend.version),
            codec=chosen.name,
            params=[ParamSpec(n, sums[n].numel()) for n in names],
            receipts=receipts,
            parts=parts,
            nonce=os.urandom(16),
            carried=carried,
        )
        previous = self._last.get(uid) if carried else None
        reveal = None
        if kept.complete and len(kept.pairs) == len(receipts):
            reveal = Reveal(
                tuple(kept.pairs),
                residual,
                previous[0] if previous is not None else None,
                tuple(previous[1]) if previous is not None else (),
            )
        self._carried_from[uid] = contribution.nonce
        self._last[uid] = (contribution, parts)
        return contribution, parts, _Kept(reveal, kept.nbytes)

    async def _deliver(
        self,
        uid: str,
        contribution: Contribution,
        parts: list[torch.Tensor],
        kept: _Kept,
        began: float,
    ) -> None:
        """Deliver until accepted, refused or given up; ``began``: (trio time) when its
        sending began (a delivery's time is timed from there)."""
        target = responsible_aggregator(uid, self.aggregators, self.assignment)
        wires = [to_wire(p) for p in parts]
        delay = self.config.retry_initial
        deadline = trio.current_time() + self.config.give_up_after
        self.stats.sent += 1
        self._in_flight += 1
        self._all_delivered = trio.Event() if self._all_delivered.is_set() else self._all_delivered
        try:
            await self._deliver_until(
                uid, contribution, wires, target, delay, deadline, kept, began
            )
        finally:
            if self.kept_budget is not None:
                self.kept_budget.give_back(kept.nbytes)
            self._in_flight -= 1
            if self._in_flight == 0:
                self._all_delivered.set()

    async def delivered(self) -> None:
        """Returns when no contribution is on its way (each ended: accepted, refused or
        given up)."""
        await self._all_delivered.wait()

    async def _deliver_until(
        self,
        uid: str,
        contribution: Contribution,
        wires: list[Any],
        target: PeerID,
        delay: float,
        deadline: float,
        kept: _Kept,
        began: float,
    ) -> None:
        first_try = True
        while trio.current_time() < deadline:
            wait = self._down_until.get(target, 0.0) - trio.current_time()
            if wait > 0:  # another delivery found the aggregator silent: one back-off
                await trio.sleep(min(wait, deadline - trio.current_time()))
                continue
            try:
                reply = await self.peer.rpc.call(
                    target, CONTRIBUTE, {"header": contribution.encode()}, wires, timeout=60
                )
                self._answered(target)
                self._quiet_repeats.pop(uid, None)
                self.quiet_reason.pop(uid, None)
                self._ended(uid, "accepted")
                self._heard(uid, reply.meta, began, first_try)
                if reply.meta.get("audit") is True:
                    await self._reveal(target, contribution, kept)
                return
            except RemoteError as exc:
                self._answered(target)
                if exc.code == Refusal.REPLAY:  # an earlier try got through; its ack was lost
                    self._ended(uid, "accepted")
                    # and with it whether it is audited: reveal in case (ignored if not)
                    await self._reveal(target, contribution, kept, asked=False)
                    return
                if exc.code in ("rate_limited", "overloaded", "unavailable"):
                    pass  # worth trying again later
                else:
                    self._ended(uid, exc.code)
                    self._forget_residual(uid, contribution)
                    if exc.code == Refusal.BANNED_BY_PROJECT:
                        self._pause_for_ban(exc)
                    elif exc.code in COME_BACK_LATER:
                        self._come_back_later(uid, exc)
                    elif exc.code == Refusal.STALE:
                        # not an offence: versions moved faster than we pulled them
                        log.info("contribution to %s came too late: %s", uid, exc.message)
                        if self.on_stale is not None:
                            self.on_stale(uid)
                    elif is_offence(exc.code):
                        log.warning("aggregator refused our contribution to %s: %s", uid, exc)
                    else:
                        log.info("aggregator refused our contribution to %s: %s", uid, exc)
                    return
            except RpcError as exc:
                self._silent(target, exc)
                first_try = False
                continue
            first_try = False
            self.stats.retries += 1
            await trio.sleep(delay)
            delay = min(delay * 2, self.config.retry_max)
        self._ended(uid, "given_up")
        self._forget_residual(uid, contribution)
        log.warning(
            "gave up sending a contribution to %s after %.0f s", uid, self.config.give_up_after
        )

    def _come_back_later(self, uid: str, exc: RemoteError) -> None:
        """The aggregator has enough of our gradients of ``uid`` for now: hold them back
        for a while (longer while it repeats), instead of sending what is refused."""
        self._quiet_repeats[uid] += 1
        pause = pause_after(exc.code, self._quiet_repeats[uid], self.config.round_seconds)
        self._quiet_until[uid] = trio.current_time() + pause
        if self.quiet_reason.get(uid) != exc.message:
            log.info("%s: %s; sending its gradients again in %.0f s", uid, exc.message, pause)
        self.quiet_reason[uid] = exc.message
        self.quiet_code[uid] = exc.code

    def _answered(self, target: PeerID) -> None:
        self._down_until.pop(target, None)
        self._down_delay.pop(target, None)
        self._silent_since.pop(target, None)

    def _silent(self, target: PeerID, exc: RpcError) -> None:
        """``target`` did not answer: every delivery to it waits one shared back-off."""
        now = trio.current_time()
        if now < self._down_until.get(target, 0.0):
            return  # another delivery's failure already set this back-off
        delay = self._down_delay.get(target, self.config.retry_initial)
        self._down_delay[target] = min(delay * 2, self.config.retry_max)
        self._down_until[target] = now + delay
        self._silent_since.setdefault(target, now)
        self.stats.retries += 1
        log.info("aggregator %s does not answer (%s); again in %.0f s", target, exc, delay)

    def problem(self) -> str:
        """Why the work done here does not reach the aggregators now, in a sentence for
        the volunteer ("" when it does)."""
        now = trio.current_time()
        silent = [
            now - since
            for since in self._silent_since.values()
            if now - since >= self.config.unreachable_after
        ]
        if silent:
            return (
                f"the project's aggregator has not answered for {max(silent) / 60:.0f} min: "
                "the work done here is not counted until it does"
            )
        quiet = [uid for uid in self.backends if now < self._quiet_until.get(uid, 0.0)]
        if quiet and len(quiet) == len(self.backends):
            reason = self.quiet_reason.get(quiet[0], "")
            if reason.startswith("too many invalid"):
                return f"the aggregator refuses this node's contributions: {reason}"
            codes = {self.quiet_code.get(uid, "") for uid in quiet}
            if codes == {WAITING}:  # the words of a volunteer, not the aggregator's
                return "the experts served here learn once other volunteers serve them too"
            return (
                f"the aggregator takes no more of this node's work for now: {in_words(codes.pop())}"
            )
        return ""

    @property
    def banned(self) -> bool:
        return trio.current_time() < self.paused_until

    def _pause_for_ban(self, exc: RemoteError) -> None:
        """Stop contributing for a while (what is computed meanwhile is dropped)."""
        if not self.banned:
            log.warning(
                "the project banned this volunteer (%s); no contributions for %.0f min",
                exc,
                BANNED_PAUSE_SECONDS / 60,
            )
        self.paused_until = trio.current_time() + BANNED_PAUSE_SECONDS

    def _forget_residual(self, uid: str, contribution: Contribution) -> None:
        """A contribution that was not accepted is lost whole: the residual its encoding
        left means nothing, and no audit could bound it (its grid is unknown to the
        aggregator), so the next contribution starts without it."""
        if self._carried_from.get(uid) == contribution.nonce:
            self._feedback[uid].residuals.clear()
            del self._carried_from[uid]

    async def _reveal(
        self, target: PeerID, contribution: Contribution, kept: _Kept, *, asked: bool = True
    ) -> None:
        """Show the aggregator what ``contribution`` was computed from (it drew it for an
        audit), retrying while it may still be waiting."""
        if asked:
            self.stats.audited += 1
        meta: dict[str, Any] = {"nonce": contribution.nonce}
        wires: list[Any] = []
        if kept.reveal is None:
            meta["missing"] = True
        else:
            more, tensors = kept.reveal.to_wire()
            meta.update(more)
            wires = [to_wire(t) for t in tensors]
        deadline = trio.current_time() + self.config.reveal_seconds
        delay = self.config.retry_initial
        while trio.current_time() < deadline:
            try:
                await self.peer.rpc.call(target, REVEAL, meta, wires, timeout=60)
            except TooLarge:
                meta, wires = {"nonce": contribution.nonce, "missing": True}, []
                continue
            except RemoteError as exc:
                if exc.code not in ("rate_limited", "overloaded", "unavailable"):
                    if asked:
                        log.warning("the aggregator would not take our reveal: %s", exc)
                    return
            except RpcError as exc:
                log.info("could not reveal a contribution (%s); retrying in %.0f s", exc, delay)
            else:
                if asked and meta.get("missing"):
                    self.stats.unrevealable += 1
                elif asked:
                    self.stats.revealed += 1
                return
            await trio.sleep(delay)
            delay = min(delay * 2, self.config.retry_max)

    def _ended(self, uid: str, outcome: str) -> None:
        if outcome == "accepted":
            self.stats.accepted += 1
        elif outcome == "given_up":
            self.stats.given_up += 1
        else:
            self.stats.refused[outcome] += 1
        if self.on_result is not None:
            self.on_result(uid, outcome)


def _version_of(receipts: Sequence[Any], current: int) -> int:
    """The weights version the gradients were computed on: the one their receipts name
    (reading the backend's version instead races with a swap of the weights)."""
    versions = {getattr(r, "version", current) for r in receipts}
    if len(versions) == 1:
        return int(versions.pop())
    log.warning("receipts of several versions in one contribution: %s", sorted(versions))
    return current
