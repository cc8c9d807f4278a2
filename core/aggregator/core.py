"""The aggregator's engine, without networking: accept (verify, journal, then ack),
aggregate per expert per round, step the optimizer, checkpoint, recover after a crash.

Nothing accepted is lost: ``submit`` returns "accepted" only after the contribution is in
the fsynced journal. A round's result is only final once its checkpoint is complete; a
checkpoint lists the nonces it applied, so replaying the journal after a crash applies
each contribution exactly once.
"""

from __future__ import annotations

import logging
import shutil
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.aggregator.compact import state_dtype as compact_state_dtype
from core.aggregator.credit import CreditLedger, credited_shares, round_grants
from core.aggregator.heap import release_free_memory
from core.aggregator.journal import Journal, Location, tensor_from_record, tensor_record
from core.aggregator.optimizer import CompactAdam
from core.aggregator.replay import SeenContributions
from core.aggregator.robust import (
    ExpertRoundState,
    RobustSettings,
    load_round_state,
    lower_median,
    save_round_state,
)
from core.aggregator.rounds import ExpertRounds, RoundRule
from core.aggregator.stats import (
    AggregatorStatistics,
    ContributorStatistics,
    load_statistics,
    save_statistics,
)
from core.aggregator.store import ExpertFiles, StateFile
from core.aggregator.strikes import Strikes
from core.aggregator.trunk import TrunkRounds, TrunkSettings
from core.aggregator.verify import (
    Rejected,
    VerifyContext,
    check_claims,
    check_payload,
    decode_gradients,
)
from core.checkpoints import CheckpointStore, load_optimizer_state, optimizer_state
from core.clock import SYSTEM_CLOCK, Clock
from core.experts.registry import ExpertSpec, build_expert
from core.experts.weights import weights_hash
from core.project.schedule import Schedule
from core.protocol.contributions import TRUNK_UID, Contribution
from core.protocol.credit import DAY_SECONDS, day_of
from core.protocol.refusals import BANNED, WAITING, Refusal, is_offence

log = logging.getLogger(__name__)

#: A round short of distinct contributors holds at most this many rounds' samples; past
#: them, those it has are refused (not an offence) until another contributor comes.
THIN_ROUND_ROUNDS = 4

#: Contributors whose statistics are kept without any accepted contribution (the
#: oldest are forgotten; strikes and bans: core/aggregator/strikes.py).
MAX_CONTRIBUTORS = 1024


@dataclass(frozen=True)
class AggregatorSettings:
    project: str
    spec: ExpertSpec
    uids: tuple[str, ...]
    trainers: frozenset[bytes]
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    staleness_bound: int = 4
    round_samples: int = 4096
    round_seconds: float = 60.0
    #: distinct contributors a version of an expert needs: a round with fewer waits for
    #: more (holding at most THIN_ROUND_ROUNDS rounds' samples of those it has)
    min_contributors: int = 1
    robust: RobustSettings = field(default_factory=RobustSettings)
    #: invalid contributions a peer may send per ``ban_window`` before it is banned
    max_invalid: int = 5
    ban_window: float = 300.0
    ban_seconds: float = 600.0
    seed: int = 0
    #: set when this aggregator holds the trunk (TRUNK_UID among ``uids``; its initial
    #: weights come in ``initial``)
    trunk: TrunkSettings | None = None
    #: the share of accepted contributions audited (core/aggregator/auditor.py); > 0
    #: keeps the weights of the last ``staleness_bound`` + 1 versions for recomputing
    contribution_audit_rate: float = 0.0
    #: a project ban takes back the credit of the days this far before it (the work
    #: audits stand behind; a ban by strikes takes back its ``ban_window``'s days)
    credit_revoke_seconds: float = DAY_SECONDS
    #: the experts' learning-rate schedule (over each expert's versions), weight decay
    #: and clipping (the manifest's [training.expert_schedule]); not the trunk's
    expert_schedule: Schedule = field(default_factory=Schedule)


@dataclass
class _Pending:
    """An accepted contribution waiting for its round. Its gradient stays in the
    journal (read back at the round): in memory, an aggregator holds no gradient."""

    contributor: str
    samples: int
    nonce: bytes
    where: Location
    #: drawn for an audit and not yet cleared: kept out of rounds (with its contribution
    #: and encoded parts, which the audit needs)
    held: bool = False
    contribution: Contribution | None = None
    parts: list[torch.Tensor] | None = None
    uid: str = ""
    #: the version its gradient was computed on, when it was signed (the contributor's
    #: clock) and accepted (this aggregator's monotonic clock): how late it lands
    base_version: int = 0
    signed_at: float = 0.0
    accepted_at: float = 0.0


class Banned(Rejected):
    def __init__(self, seconds: float) -> None:
        super().__init__(BANNED, f"too many invalid contributions; try again in {seconds:.0f} s")


class AggregatorCore:
    def __init__(
        self,
        settings: AggregatorSettings,
        folder: Path,
        initial: dict[str, nn.Module] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``clock``: what rounds and timestamps are timed by (tests move one by hand)."""
        self.settings = settings
        self.clock = clock
        self.folder = folder
        self.modules: dict[str, nn.Module] = {}
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.versions: dict[str, int] = {}
        self.robust: dict[str, ExpertRoundState] = {}
        self.pending: dict[str, list[_Pending]] = defaultdict(list)
        self.round_started: dict[str, float] = {}
        #: (monotonic) when each uid's last round ran, in this process: an expert's next
        #: round begins there (``round_began``)
        self.last_round_at: dict[str, float] = {}
        #: nonces and receipts' batch ids of the contributions accepted lately
        self.seen = SeenContributions()
        self.applied: set[bytes] = set()
        self.stats = AggregatorStatistics()
        #: credit per contributor per day (core/aggregator/credit.py), and per uid the
        #: last version whose round's grants it holds (a restart grants the rest once)
        self.credit = CreditLedger()
        self.credited: dict[str, int] = {}
        # per contributor (hex key), bounded: identities are free to make
        self.strikes = Strikes(
            max_invalid=settings.max_invalid,
            window=settings.ban_window,
            ban_seconds=settings.ban_seconds,
        )
        #: each uid's whole state, a file each, and the weights of recent versions
        #: (audits recompute with them) on disk
        self.files = ExpertFiles(folder)
        self._state_file = StateFile(folder / "state.msgpack")
        #: the contributions seen (replays refused), written apart from the state: only
        #: what leaves the journal must be in it (below, ``_save_state``)
        self._seen_file = StateFile(folder / "seen.msgpack")
        #: bytes written by rounds (expert files, kept versions, the state file, round
        #: records): what a round's durability costs
        self.round_bytes_written = 0
        #: per journal segment, the contributions there not yet applied or discarded
        self._unsettled: Counter[int] = Counter()
        self._state_saved_at: Location | None = None
        state_dtype = compact_state_dtype(settings.spec.torch_dtype)
        self.rules: dict[str, RoundRule] = {}
        for uid in settings.uids:
            if uid == TRUNK_UID:  # the one place the trunk is told apart: its rules
                if settings.trunk is None or initial is None or uid not in initial:
                    raise ValueError("the trunk needs its settings and initial weights")
                self.rules[uid] = TrunkRounds(settings.trunk, len(settings.trainers))
                module = initial[uid]
            else:
                self.rules[uid] = ExpertRounds(
                    settings.min_contributors,
                    settings.round_samples,
                    settings.round_seconds,
                    settings.optimizer,
                    settings.learning_rate,
                    settings.robust,
                    schedule=settings.expert_schedule,
                    state_dtype=state_dtype,
                )
                module = (initial or {}).get(uid) or build_expert(settings.spec, seed=settings.seed)
                # float32 master weights whatever the project's dtype: an update smaller
                # than a 16-bit weight's rounding step still counts (published: rounded)
                module = module.float()
            self.modules[uid] = module
            self.optimizers[uid] = self.rules[uid].optimizer(module)
            self.versions[uid] = 0
            self.robust[uid] = ExpertRoundState()
        self._params = {
            uid: {name: p.numel() for name, p in m.named_parameters()}
            for uid, m in self.modules.items()
        }
        self._journal = Journal(folder)
        self._recover()

    # ------------------------------------------------------------ accepting

    def _context(self, now: float) -> VerifyContext:
        return VerifyContext(
            project=self.settings.project,
            params=self._params,
            current_version=self.versions,
            staleness_bound=self.settings.staleness_bound,
            trainers=self.settings.trainers,
            seen_nonces=self.seen.nonces,
            seen_batches=self.seen.batches,
            now=now,
        )

    def screen(
        self,
        contribution: Contribution,
        now: float,
        *,
        payload_bytes: int | None = None,
        authenticated: bool = False,
    ) -> None:
        """The checks that need no signature and no payload (cheap: run on a request's
        header, before its payload is read). Raises Rejected. ``authenticated``: the
        sender is known to hold the contributor's key (the connection proved it), so a
        refusal counts against that contributor; otherwise it counts only once the
        message's own signature is checked."""
        who = contribution.contributor.hex()
        left = self.strikes.ban_left(who, now)
        if left > 0:
            self.stats.rejected[Refusal.BANNED] += 1
            raise Banned(left)
        if who in self.strikes.project_banned:
            self.stats.rejected[Refusal.BANNED_BY_PROJECT] += 1
            raise Rejected(
                Refusal.BANNED_BY_PROJECT, "a trainer or aggregator of the project banned it"
            )
        try:
            check_claims(contribution, self._context(now), payload_bytes)
            self._check_room(contribution)
        except Rejected as exc:
            attributable = authenticated or contribution.verify_signature()
            self.refused(contribution, exc, now, attributable=attributable)
            raise

    def _check_room(self, c: Contribution) -> None:
        """A round waiting for more distinct contributors keeps what it has up to a
        bound; past it, only a contributor it lacks gets in."""
        if self.contributors_short(c.uid) == 0:
            return
        full = self.pending_samples(c.uid) >= THIN_ROUND_ROUNDS * self.settings.round_samples
        if full and c.contributor.hex() in {p.contributor for p in self._ready(c.uid)}:
            raise Rejected(
                WAITING,
                f"{c.uid}'s round waits for {self.contributors_short(c.uid)} more "
                "contributor(s) and holds enough of yours (this one is dropped)",
            )

    def refused(
        self, contribution: Contribution, exc: Rejected, now: float, *, attributable: bool
    ) -> None:
        """Count a refusal; against its contributor only when ``attributable`` (an
        unsigned message names a contributor it cannot prove: counting or banning it
        would let anyone get an honest volunteer banned)."""
        self.stats.rejected[exc.reason] += 1
        if not attributable or exc.reason == "bad_signature":
            return
        who = contribution.contributor.hex()
        entry = self._contributor(who)
        if entry is not None:
            entry.rejected[exc.reason] += 1
        if is_offence(exc.reason):
            self._strike(who, now)

    def accept(
        self,
        contribution: Contribution,
        parts: Sequence[torch.Tensor],
        now: float,
        *,
        held: bool = False,
    ) -> None:
        """Make durable a contribution whose payload checked out (``check_payload``): its
        gradient stays in the journal, read back at its round. Its claims are checked
        again against the state now (another copy may have been accepted meanwhile).
        Returns once it is in the fsynced journal; raises Rejected otherwise. ``held``:
        drawn for an audit, it joins no round until ``release``d (or ``discard``ed)."""
        self.screen(contribution, now, authenticated=True)
        record = ["c", contribution.encode(), [tensor_record(p) for p in parts]]
        where = self._journal.append([*record, True] if held else record)
        self._remember(contribution, where, list(parts) if held else None)
        self.stats.accepted += 1
        entry = self._contributor(contribution.contributor.hex(), create=True)
        assert entry is not None
        entry.accepted += 1

    def submit(
        self, contribution: Contribution, parts: Sequence[torch.Tensor], now: float | None = None
    ) -> None:
        """Verify and, if valid, make durable: screen, payload, accept in one call (the
        network service runs the three steps apart, the payload outside the engine).
        Returns normally only once the contribution is in the fsynced journal; raises
        Rejected (with its reason) otherwise."""
        now = self.clock.wall() if now is None else now
        self.screen(contribution, now)
        try:
            check_payload(contribution, parts)
        except Rejected as exc:
            self.refused(contribution, exc, now, attributable=True)
            raise
        self.accept(contribution, parts, now)

    def _contributor(self, who: str, *, create: bool = False) -> ContributorStatistics | None:
        """Statistics of a contributor. Identities cost nothing, so entries of ones that
        never had a contribution accepted are made only while there is room."""
        entry = self.stats.contributors.get(who)
        if entry is None and (create or len(self.stats.contributors) < MAX_CONTRIBUTORS):
            entry = self.stats.contributors[who] = ContributorStatistics()
        return entry

    def _remember(
        self, c: Contribution, where: Location, held_parts: list[torch.Tensor] | None
    ) -> None:
        self.seen.remember(c)
        held = held_parts is not None
        if not held and not self._ready(c.uid):
            self.round_started[c.uid] = self.clock.monotonic()
        self.pending[c.uid].append(
            _Pending(
                c.contributor.hex(),
                c.samples,
                c.nonce,
                where,
                held,
                c if held else None,
                held_parts,
                c.uid,
                c.base_version,
                float(c.timestamp),
                self.clock.monotonic(),
            )
        )
        self._unsettled[where.segment] += 1

    def _ready(self, uid: str) -> list[_Pending]:
        """The pending contributions of ``uid`` that may join its round (not held)."""
        return [p for p in self.pending[uid] if not p.held]

    def held(self) -> list[_Pending]:
        """Contributions drawn for an audit and not yet cleared (after a restart too)."""
        return [p for pending in self.pending.values() for p in pending if p.held]

    def release(self, nonce: bytes) -> bool:
        """A held contribution passed its audit: it joins its expert's round."""
        return self._settle_held(nonce, passed=True)

    def discard(self, nonce: bytes) -> bool:
        """A held contribution failed its audit, or could not be audited: it joins no
        round, now or after a restart."""
        return self._settle_held(nonce, passed=False)

    def _settle_held(self, nonce: bytes, *, passed: bool, replaying: bool = False) -> bool:
        """Release (``passed``) or discard a held contribution; journaled unless
        ``replaying`` the journal. False when none with that nonce is held."""
        entry = next((p for p in self.held() if p.nonce == nonce), None)
        if entry is None:
            return False
        if not replaying:
            self._journal.append(["r" if passed else "d", nonce])
        if passed:
            if not self._ready(entry.uid):
                self.round_started[entry.uid] = self.clock.monotonic()
            entry.held, entry.contribution, entry.parts = False, None, None
        else:
            self.pending[entry.uid] = [p for p in self.pending[entry.uid] if p is not entry]
            self.applied.add(nonce)  # settled: a replay of the journal skips it
            self._settled(entry)
        return True

    def _settled(self, entry: _Pending) -> None:
        self._unsettled[entry.where.segment] -= 1
        if self._unsettled[entry.where.segment] <= 0:
            del self._unsettled[entry.where.segment]

    def weights_of(self, uid: str, version: int) -> dict[str, torch.Tensor] | None:
        """A copy of the weights of ``uid`` at ``version`` as published (in the
        project's dtype), if current or kept."""
        if version == self.versions.get(uid):
            return self.published_state(uid)
        return self.files.version(uid, version)

    def published_state(self, uid: str) -> dict[str, torch.Tensor]:
        """A copy of the current weights of ``uid`` as volunteers get them: an expert's
        rounded to the project's dtype (the trunk as it is)."""
        dtype = None if uid == TRUNK_UID else self.settings.spec.torch_dtype
        return {
            k: v.detach().to(dtype or v.dtype, copy=True)
            for k, v in self.modules[uid].state_dict().items()
        }

    def published_module(self, uid: str) -> nn.Module:
        """The current weights of ``uid`` as volunteers get them, as a module (to hash or
        save): the master itself where nothing is rounded."""
        module = self.modules[uid]
        if uid == TRUNK_UID or self.settings.spec.torch_dtype == torch.float32:
            return module
        with torch.device("meta"):  # no weights drawn only to be replaced
            served = build_expert(self.settings.spec)
        served.load_state_dict(self.published_state(uid), assign=True)
        return served

    def _strike(self, who: str, now: float) -> None:
        strikes = self.strikes.strike(who, now)
        if strikes:
            self.stats.banned_peers += 1
            wall = self.clock.wall()
            self._revoke(who, wall - self.settings.ban_window, wall)
            log.warning(
                "banning %s for %.0f s after %d invalid contributions",
                who[:16],
                self.settings.ban_seconds,
                strikes,
            )

    def ban_contributor(self, public_key: bytes) -> int:
        """Honour a project ban (core/project/bans.py): refuse the contributor from now
        on, and drop what it has pending. Returns the contributions dropped."""
        who = public_key.hex()
        self.strikes.project_banned.add(who)
        wall = self.clock.wall()
        self._revoke(who, wall - self.settings.credit_revoke_seconds, wall)
        dropped = 0
        for uid, pending in self.pending.items():
            kept = [p for p in pending if p.contributor != who]
            dropped += len(pending) - len(kept)
            self.pending[uid] = kept
            for p in pending:
                if p.contributor == who:
                    self.applied.add(p.nonce)  # settled: a replay skips it
                    self._settled(p)
        if dropped:
            log.warning("dropped %d pending contributions of banned %s", dropped, who[:16])
        return dropped

    def _revoke(self, who: str, start: float, end: float) -> None:
        """A ban takes back ``who``'s credit of the days from ``start`` to ``end``
        (wall seconds); kept with the next state saved."""
        taken = self.credit.revoke(who, day_of(start), day_of(end))
        if taken:
            log.warning("took back %.0f credit of banned %s", taken, who[:16])
            self._save_state()

    def prune(self, now: float) -> None:
        """Forget strikes and bans that ended (called now and then)."""
        self.strikes.prune(now)

    # ------------------------------------------------------------ rounds

    def pending_samples(self, uid: str) -> int:
        return sum(p.samples for p in self._ready(uid))

    def round_began(self, uid: str) -> float | None:
        """(Monotonic) when ``uid``'s open round began; None when none is open. An
        expert's rounds keep a beat: one begins where the one before it ended, unless no
        contribution came for a round's time after that (then at the first one), so that
        a volunteer told when a round closes knows when the next will, and sends just
        before (decision 013). The trunk's rounds begin at their first change."""
        if not self._ready(uid):
            return None
        first = self.round_started.get(uid, self.clock.monotonic())
        last = self.last_round_at.get(uid)
        if uid != TRUNK_UID and last is not None and first - last < self.settings.round_seconds:
            return last
        return first

    def closes_in(self, uid: str) -> float | None:
        """Seconds until an expert's open round is due by time (it may close sooner, on
        samples, or later, short of contributors); None when none is open, and for the
        trunk."""
        began = self.round_began(uid)
        if began is None or uid == TRUNK_UID:
            return None
        return max(0.0, began + self.settings.round_seconds - self.clock.monotonic())

    def due(self, uid: str) -> bool:
        began = self.round_began(uid)
        if began is None:
            return False
        waited = self.clock.monotonic() - began
        senders = len({p.contributor for p in self._ready(uid)})
        return self.rules[uid].due(senders, self.pending_samples(uid), waited)

    def stalled(self, uid: str) -> bool:
        """Whether ``uid``'s round has waited a whole round's time and still lacks
        distinct contributors. A round short of them for less is the normal course: its
        samples may be in before the other volunteers' next contributions (every
        contribution_seconds), and an owner's healthy swarm was reported stuck."""
        if not self._ready(uid) or not self.contributors_short(uid):
            return False
        waited = self.clock.monotonic() - self.round_started.get(uid, self.clock.monotonic())
        return waited >= self.settings.round_seconds

    def contributors_short(self, uid: str) -> int:
        """How many more distinct contributors ``uid``'s round needs (0: enough)."""
        senders = {p.contributor for p in self._ready(uid)}
        return max(0, self.rules[uid].min_contributors - len(senders))

    def _sibling_scale(self) -> float | None:
        """The scale of this aggregator's other experts (all of one spec): what a lone
        contributor's step is clipped to on an expert never compared before."""
        scales = [st.scale for st in self.robust.values() if st.scale is not None]
        return lower_median(scales) if scales else None

    def run_round(self, uid: str) -> int:
        """Aggregate the pending contributions of ``uid``, step, checkpoint. New version."""
        pending = self._ready(uid)
        if not pending:
            raise ValueError(f"no contributions pending for {uid}")
        module = self.modules[uid]
        names = [n for n, _ in module.named_parameters()]
        per_contributor: dict[str, tuple[torch.Tensor, int]] = {}
        for p in pending:
            grads = self._gradient_of(p)
            flat = torch.cat([grads[n] for n in names])
            total, samples = per_contributor.get(p.contributor, (torch.zeros_like(flat), 0))
            per_contributor[p.contributor] = (total + flat, samples + p.samples)
        means = {who: total / samples for who, (total, samples) in per_contributor.items()}
        samples_of = {who: samples for who, (_, samples) in per_contributor.items()}
        aggregate, kept = self.rules[uid].combine(
            means, self.robust[uid], self.versions[uid], self._sibling_scale(), samples_of
        )
        # what the rule kept, forgiven the noise of fewer samples: credit, and the
        # influence the owner reads to tell poisoners from volunteers with little work
        shares = credited_shares(kept, self.robust[uid].weights)
        for who, share in shares.items():
            self.stats.contributors[who].rounds += 1
            self.stats.contributors[who].samples += samples_of[who]
            if len(shares) > 1:  # alone in a round, there is nothing to compare it with
                self.stats.contributors[who].compared_rounds += 1
                self.stats.contributors[who].influence_sum += share
        # the rate for this version (recomputed from it, never restored) and the clipping
        aggregate = self.rules[uid].prepare(self.optimizers[uid], aggregate, self.versions[uid])
        offset = 0
        for param in module.parameters():
            n = param.numel()
            param.grad = aggregate[offset : offset + n].reshape(param.shape).to(param.dtype).clone()
            offset += n
        if self.settings.contribution_audit_rate > 0 and self.rules[uid].audited:
            self._keep_version(uid)
        self.optimizers[uid].step()
        self.optimizers[uid].zero_grad(set_to_none=True)
        self.versions[uid] += 1
        self.last_round_at[uid] = self.clock.monotonic()
        if uid != TRUNK_UID:  # the trunk's lateness is the trainers' own (decision 013)
            now, wall, replaced = self.clock.monotonic(), self.clock.wall(), self.versions[uid] - 1
            for p in pending:
                self.stats.applied(
                    replaced - p.base_version, now - p.accepted_at, wall - p.signed_at, p.samples
                )
        nonces = [p.nonce for p in pending]
        self.applied.update(nonces)
        self.pending[uid] = [p for p in self.pending[uid] if p.held]
        self.stats.rounds += 1
        # the trunk's contributors are the project's trainers: no credit
        grants = {} if uid == TRUNK_UID else round_grants(samples_of, shares)
        day = day_of(self.clock.wall())
        self._grant(uid, self.versions[uid], day, grants)
        self._save_round(uid, nonces, day, grants)
        for p in pending:
            self._settled(p)
        self._drop_settled_segments()
        release_free_memory()  # the round's transients, freed inside the heap
        log.info(
            "%s: version %d from %d contributions (%d contributors; kept %s)",
            uid,
            self.versions[uid],
            len(pending),
            len(means),
            ", ".join(f"{who[:8]} {share:.0%}" for who, share in kept.items()),
        )
        return self.versions[uid]

    def _keep_version(self, uid: str) -> None:
        """Keep the weights of the version about to be replaced, on disk: contributions
        computed on it may still arrive (up to ``staleness_bound`` versions late) and be
        audited."""
        self.round_bytes_written += self.files.keep_version(
            uid, self.versions[uid], self.published_state(uid)
        )
        self.files.forget_versions(uid, self.settings.staleness_bound + 1)

    def _gradient_of(self, p: _Pending) -> dict[str, torch.Tensor]:
        """A pending contribution's decoded gradient, read back from the journal."""
        record = self._journal.read_at(p.where)
        parts = [tensor_from_record(r) for r in record[2]]
        return decode_gradients(Contribution.decode(record[1]), parts)

    # ------------------------------------------------------------ durability

    def _uid_state(self, uid: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors: dict[str, torch.Tensor] = {
            f"w/{name}": t.detach() for name, t in self.modules[uid].state_dict().items()
        }
        meta = {
            "version": self.versions[uid],
            "optimizer": optimizer_state(self.optimizers[uid], "o", tensors),
            "robust": save_round_state(self.robust[uid], "r", tensors),
        }
        return tensors, meta

    def _grant(self, uid: str, version: int, day: int, grants: dict[str, float]) -> None:
        """Book the credit of ``uid``'s round that made ``version`` (once)."""
        if version <= self.credited.get(uid, 0):
            return
        self.credit.grant(grants, day)
        self.credited[uid] = version

    def _save_round(
        self, uid: str, nonces: list[bytes], day: int, grants: dict[str, float]
    ) -> None:
        """What a round of ``uid`` changed, durably: its file (with the nonces it
        applied, so that a restart between the two writes applies none twice, and the
        credit it granted, so that a restart grants it once), then a round record in the
        journal (the nonces and grants stay known once that file is replaced again),
        then the small state."""
        tensors, meta = self._uid_state(uid)
        meta["applied"] = [n.hex() for n in nonces]
        meta["credit"] = [day, grants]
        self.round_bytes_written += self.files.save(uid, tensors, meta)
        before = self._journal.bytes_written
        self._journal.append(["a", uid, self.versions[uid], nonces, day, grants])
        self.round_bytes_written += self._journal.bytes_written - before
        self._save_state()

    def _save_state(self, *, seen: bool = False) -> None:
        """The small state (statistics, strikes, credit), after every round; with
        ``seen``, the contributions seen too. A restart remembers every contribution
        still in the journal again (applied or not), so the seen ones must be written
        only before journal segments go (and at a checkpoint): writing every nonce of
        the last hour after each round made a round's cost grow with the hour's
        contributions (~6% of the benchmark's process at 32 volunteers)."""
        where = self._journal.append(["s"])  # marks where this state was taken
        # what no contribution can be accepted with any more goes before it is written
        self.seen.forget(self.clock.wall(), self.versions, self.settings.staleness_bound)
        if seen:
            self.round_bytes_written += self._seen_file.save({"seen": self.seen.save()})
        state = {
            "saved_at": [where.segment, where.offset],
            "stats": save_statistics(self.stats),
            "strikes": self.strikes.save(),
            "credit": self.credit.save(),
            "credited": dict(self.credited),
        }
        self.round_bytes_written += self._state_file.save(state)
        self._state_saved_at = where

    def _drop_settled_segments(self) -> None:
        """Delete the journal's oldest segments once nothing in them waits: everything
        up to the oldest segment holding a pending contribution."""
        oldest = min(self._unsettled, default=self._journal.current)
        if self._journal.segments() and self._journal.segments()[0] < oldest:
            self._save_state(seen=True)  # the seen nonces of those segments, before they go
            self._journal.drop_before(min(self._unsettled, default=self._journal.current))

    def checkpoint(self) -> None:
        """Write every uid's file and the state (a start from an older layout, a
        clean stop); rounds write only what they change."""
        for uid in self.modules:
            tensors, meta = self._uid_state(uid)
            meta["applied"] = []
            self.files.save(uid, tensors, meta)
        self._save_state(seen=True)

    def _recover(self) -> None:
        loaded = False
        #: per uid, the credit of the round that wrote its file: (version, [day, grants])
        round_credit: dict[str, tuple[int, list[Any]]] = {}
        for uid, module in self.modules.items():
            found = self.files.load(uid)
            if found is None:
                continue
            tensors, meta = found
            module.load_state_dict({n: tensors[f"w/{n}"] for n in module.state_dict()})
            load_optimizer_state(self.optimizers[uid], meta["optimizer"], "o", tensors)
            self.robust[uid] = load_round_state(meta["robust"], "r", tensors)
            self.versions[uid] = int(meta["version"])
            self.applied.update(bytes.fromhex(n) for n in meta.get("applied", []))
            if meta.get("credit"):
                round_credit[uid] = (self.versions[uid], meta["credit"])
            loaded = True
        if not loaded and (self.folder / "checkpoints" / "CURRENT").exists():
            self._recover_legacy(CheckpointStore(self.folder / "checkpoints"))
        state = self._state_file.load()
        saved_at = None
        seen_written = self._seen_file.load()
        if seen_written is not None:
            self.seen = SeenContributions.load(seen_written, self.clock.wall(), self.versions)
        if state is not None:
            if seen_written is None:  # a state written before seen.msgpack (2026-11-28)
                self.seen = SeenContributions.load(state, self.clock.wall(), self.versions)
            saved_at = Location(*state["saved_at"])
            self.stats = load_statistics(state["stats"])
            self.strikes.load(state.get("strikes", {}))
            self.credit = CreditLedger.load(state.get("credit", {}))
            self.credited = {str(u): int(v) for u, v in state.get("credited", {}).items()}
        replayed = 0
        for where, record in self._journal.records():
            kind = record[0]
            if kind in ("r", "d"):  # an audit's outcome
                self._settle_held(record[1], passed=kind == "r", replaying=True)
                continue
            if kind == "a":  # a round applied these (its uid's file may be newer)
                for nonce in record[3]:
                    self._forget_applied(record[1], nonce)
                if len(record) > 5:  # and granted this credit (rounds since 2026-11-27)
                    self._grant(record[1], int(record[2]), int(record[4]), record[5])
                continue
            if kind != "c":
                continue
            c = Contribution.decode(record[1])
            if c.nonce in self.applied:
                self.seen.remember(c)  # applied: its copy is refused all the same
                continue
            if saved_at is None or where > saved_at:  # accepted after the state was saved
                self.stats.accepted += 1
                entry = self._contributor(c.contributor.hex(), create=True)
                assert entry is not None
                entry.accepted += 1
            parts = [tensor_from_record(r) for r in record[2]]
            # a contribution still held when the process ended is audited again: its
            # volunteer retries its reveal for a while
            self._remember(c, where, parts if len(record) > 3 and record[3] is True else None)
            replayed += 1
        # the journal's contributions were remembered again, the old ones too
        self.seen.forget(self.clock.wall(), self.versions, self.settings.staleness_bound)
        # a round whose file was written and whose journal record was not (a kill
        # between the two): its credit is in the file
        for uid, (version, (day, grants)) in round_credit.items():
            self._grant(uid, version, int(day), grants)
        if state is not None and seen_written is None:
            self._save_state(seen=True)  # the seen ones in their own file from now on
        if loaded or replayed:
            log.info(
                "recovered at versions %s with %d pending contributions", self.versions, replayed
            )

    def _forget_applied(self, uid: str, nonce: bytes) -> None:
        """A replayed round record: its contributions were applied."""
        self.applied.add(nonce)
        for p in self.pending.get(uid, []):
            if p.nonce == nonce:
                self.pending[uid] = [q for q in self.pending[uid] if q is not p]
                self._settled(p)
                return

    def _recover_legacy(self, legacy: CheckpointStore) -> None:
        """An aggregator's state in the layout before files per uid (one checkpoint of
        everything): read once, written as files, then removed."""
        latest = legacy.latest()
        assert latest is not None
        _, state, tensors = latest
        for uid, module in self.modules.items():
            module.load_state_dict({n: tensors[f"w/{uid}/{n}"] for n in module.state_dict()})
            optimizer = self.optimizers[uid]
            if isinstance(optimizer, CompactAdam):  # it was torch's Adam then
                old = torch.optim.Adam(module.parameters())
                load_optimizer_state(old, state["optimizers"][uid], f"o/{uid}", tensors)
                _adopt_adam_state(old, optimizer)
            else:
                load_optimizer_state(
                    self.optimizers[uid], state["optimizers"][uid], f"o/{uid}", tensors
                )
            self.robust[uid] = load_round_state(state["robust"][uid], f"r/{uid}", tensors)
        self.versions = dict(state["versions"])
        self.applied = set(state["applied"])
        self.seen = SeenContributions.load(state, self.clock.wall(), self.versions)
        self.checkpoint()
        shutil.rmtree(self.folder / "checkpoints", ignore_errors=True)
        log.info("moved the aggregator's state to files per expert")

    def weights_sha256(self, uid: str) -> str:
        return weights_hash(self.published_module(uid))

    def close(self) -> None:
        """Close the journal file. Takes no checkpoint: what was accepted is durable
        already, and a restart replays it (so this is also what kill -9 leaves)."""
        if not self._journal.closed:
            self._journal.close()


def _adopt_adam_state(old: torch.optim.Optimizer, new: CompactAdam) -> None:
    """torch's Adam state (float32 moments, a tensor step) as CompactAdam's."""
    for p_old, p_new in zip(
        old.param_groups[0]["params"], new.param_groups[0]["params"], strict=True
    ):
        slots = old.state.get(p_old)
        if slots:
            new.state[p_new] = {
                "step": int(slots["step"]),
                "exp_avg": slots["exp_avg"].to(new.moments),
                "exp_avg_sq": slots["exp_avg_sq"].to(new.moments),
            }
