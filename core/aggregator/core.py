"""The aggregator's engine, without networking: accept (verify, journal, then ack),
aggregate per expert per round, step the optimizer, checkpoint, recover after a crash.

Nothing accepted is lost: ``submit`` returns "accepted" only after the contribution is in
the fsynced journal. A round's result is only final once its checkpoint is complete; a
checkpoint lists the nonces it applied, so replaying the journal after a crash applies
each contribution exactly once.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.aggregator.journal import Journal, tensor_from_record, tensor_record
from core.aggregator.robust import (
    ExpertRoundState,
    RobustSettings,
    load_round_state,
    lower_median,
    save_round_state,
)
from core.aggregator.rounds import ExpertRounds, RoundRule
from core.aggregator.stats import AggregatorStatistics, ContributorStatistics
from core.aggregator.strikes import Strikes
from core.aggregator.trunk import TrunkRounds, TrunkSettings
from core.aggregator.verify import Rejected, VerifyContext, check_claims, check_payload
from core.checkpoints import CheckpointStore, load_optimizer_state, optimizer_state
from core.clock import SYSTEM_CLOCK, Clock
from core.contributing.codecs import codec
from core.experts.registry import ExpertSpec, build_expert
from core.experts.weights import weights_hash
from core.project.schedule import Schedule
from core.protocol.contributions import TRUNK_UID, Contribution
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
    #: the experts' learning-rate schedule (over each expert's versions), weight decay
    #: and clipping (the manifest's [training.expert_schedule]); not the trunk's
    expert_schedule: Schedule = field(default_factory=Schedule)


@dataclass
class _Pending:
    contributor: str
    samples: int
    nonce: bytes
    grads: dict[str, torch.Tensor]
    #: drawn for an audit and not yet cleared: kept out of rounds (with its contribution
    #: and encoded parts, which the audit needs)
    held: bool = False
    contribution: Contribution | None = None
    parts: list[torch.Tensor] | None = None
    uid: str = ""


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
        self.seen_nonces: set[bytes] = set()
        self.seen_batches: set[bytes] = set()
        self.applied: set[bytes] = set()
        self.stats = AggregatorStatistics()
        # per contributor (hex key), bounded: identities are free to make
        self.strikes = Strikes(
            max_invalid=settings.max_invalid,
            window=settings.ban_window,
            ban_seconds=settings.ban_seconds,
        )
        self._checkpoints = CheckpointStore(folder / "checkpoints")
        self._checkpoint_number = 0
        #: per expert, the weights of recent versions (audits recompute with them)
        self.history: dict[str, OrderedDict[int, dict[str, torch.Tensor]]] = defaultdict(
            OrderedDict
        )
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
        self._recover()
        self._journal = Journal(folder / "journal.log")

    # ------------------------------------------------------------ accepting

    def _context(self, now: float) -> VerifyContext:
        return VerifyContext(
            project=self.settings.project,
            params=self._params,
            current_version=self.versions,
            staleness_bound=self.settings.staleness_bound,
            trainers=self.settings.trainers,
            seen_nonces=self.seen_nonces,
            seen_batches=self.seen_batches,
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
        grads: dict[str, torch.Tensor],
        now: float,
        *,
        held: bool = False,
    ) -> None:
        """Make durable a contribution whose payload checked out (``grads``: its decoded
        ``parts``). Its claims are checked again against the state now (another copy may
        have been accepted meanwhile). Returns once it is in the fsynced journal; raises
        Rejected otherwise. ``held``: drawn for an audit, it joins no round until
        ``release``d (or ``discard``ed)."""
        self.screen(contribution, now, authenticated=True)
        record = ["c", contribution.encode(), [tensor_record(p) for p in parts]]
        self._journal.append([*record, True] if held else record)
        self._remember(contribution, grads, list(parts) if held else None)
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
            grads = check_payload(contribution, parts)
        except Rejected as exc:
            self.refused(contribution, exc, now, attributable=True)
            raise
        self.accept(contribution, parts, grads, now)

    def _contributor(self, who: str, *, create: bool = False) -> ContributorStatistics | None:
        """Statistics of a contributor. Identities cost nothing, so entries of ones that
        never had a contribution accepted are made only while there is room."""
        entry = self.stats.contributors.get(who)
        if entry is None and (create or len(self.stats.contributors) < MAX_CONTRIBUTORS):
            entry = self.stats.contributors[who] = ContributorStatistics()
        return entry

    def _remember(
        self, c: Contribution, grads: dict[str, torch.Tensor], held_parts: list[torch.Tensor] | None
    ) -> None:
        self.seen_nonces.add(c.nonce)
        self.seen_batches.update(r.batch_id for r in c.receipts)
        held = held_parts is not None
        if not held and not self._ready(c.uid):
            self.round_started[c.uid] = self.clock.monotonic()
        self.pending[c.uid].append(
            _Pending(
                c.contributor.hex(),
                c.samples,
                c.nonce,
                grads,
                held,
                c if held else None,
                held_parts,
                c.uid,
            )
        )

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
        return True

    def weights_of(self, uid: str, version: int) -> dict[str, torch.Tensor] | None:
        """A copy of the weights of ``uid`` at ``version`` as published (in the
        project's dtype), if current or kept."""
        if version == self.versions.get(uid):
            return self.published_state(uid)
        kept = self.history[uid].get(version)
        return None if kept is None else dict(kept)

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
        dropped = 0
        for uid, pending in self.pending.items():
            kept = [p for p in pending if p.contributor != who]
            dropped += len(pending) - len(kept)
            self.pending[uid] = kept
        if dropped:
            log.warning("dropped %d pending contributions of banned %s", dropped, who[:16])
        return dropped

    def prune(self, now: float) -> None:
        """Forget strikes and bans that ended (called now and then)."""
        self.strikes.prune(now)

    # ------------------------------------------------------------ rounds

    def pending_samples(self, uid: str) -> int:
        return sum(p.samples for p in self._ready(uid))

    def due(self, uid: str) -> bool:
        if not self._ready(uid):
            return False
        waited = self.clock.monotonic() - self.round_started.get(uid, self.clock.monotonic())
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
            flat = torch.cat([p.grads[n] for n in names])
            total, samples = per_contributor.get(p.contributor, (torch.zeros_like(flat), 0))
            per_contributor[p.contributor] = (total + flat, samples + p.samples)
        means = {who: total / samples for who, (total, samples) in per_contributor.items()}
        aggregate, kept = self.rules[uid].combine(
            means, self.robust[uid], self.versions[uid], self._sibling_scale()
        )
        for who, share in kept.items():
            self.stats.contributors[who].rounds += 1
            if len(kept) > 1:  # alone in a round, there is nothing to compare it with
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
        self.applied.update(p.nonce for p in pending)
        self.pending[uid] = [p for p in self.pending[uid] if p.held]
        self.stats.rounds += 1
        self.checkpoint()
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
        """Keep the weights of the version about to be replaced: contributions computed
        on it may still arrive (up to ``staleness_bound`` versions late) and be audited."""
        kept = self.history[uid]
        kept[self.versions[uid]] = self.published_state(uid)
        while len(kept) > self.settings.staleness_bound + 1:
            kept.popitem(last=False)

    # ------------------------------------------------------------ durability

    def checkpoint(self) -> None:
        tensors: dict[str, torch.Tensor] = {}
        robust_meta: dict[str, Any] = {}
        opt_meta: dict[str, Any] = {}
        for uid, module in self.modules.items():
            for name, t in module.state_dict().items():
                tensors[f"w/{uid}/{name}"] = t.detach().cpu()
            opt_meta[uid] = optimizer_state(self.optimizers[uid], f"o/{uid}", tensors)
            robust_meta[uid] = save_round_state(self.robust[uid], f"r/{uid}", tensors)
        state = {
            "versions": self.versions,
            "applied": sorted(self.applied),
            "seen_nonces": sorted(self.seen_nonces),
            "seen_batches": sorted(self.seen_batches),
            "robust": robust_meta,
            "optimizers": opt_meta,
        }
        self._checkpoint_number += 1
        self._checkpoints.save(self._checkpoint_number, state, tensors)
        if not any(self.pending.values()):
            # everything in the journal is now in the checkpoint: start it afresh
            self._journal.close()
            (self.folder / "journal.log").unlink(missing_ok=True)
            self._journal = Journal(self.folder / "journal.log")

    def _recover(self) -> None:
        latest = self._checkpoints.latest()
        if latest is not None:
            self._checkpoint_number, state, tensors = latest
            for uid, module in self.modules.items():
                module.load_state_dict({n: tensors[f"w/{uid}/{n}"] for n in module.state_dict()})
                load_optimizer_state(
                    self.optimizers[uid], state["optimizers"][uid], f"o/{uid}", tensors
                )
                self.robust[uid] = load_round_state(state["robust"][uid], f"r/{uid}", tensors)
            self.versions = dict(state["versions"])
            self.applied = set(state["applied"])
            self.seen_nonces = set(state["seen_nonces"])
            self.seen_batches = set(state["seen_batches"])
        replayed = 0
        for record in Journal.read(self.folder / "journal.log"):
            if record[0] in ("r", "d"):  # an audit's outcome
                self._settle_held(record[1], passed=record[0] == "r", replaying=True)
                continue
            c = Contribution.decode(record[1])
            if c.nonce in self.applied:
                continue
            parts = [tensor_from_record(r) for r in record[2]]
            chosen = codec(c.codec)
            per_param = len(parts) // len(c.params)
            grads = {
                p.name: chosen.decode(parts[i * per_param : (i + 1) * per_param], p.numel)
                for i, p in enumerate(c.params)
            }
            # a contribution still held when the process ended is audited again: its
            # volunteer retries its reveal for a while
            self._remember(c, grads, parts if len(record) > 3 and record[3] is True else None)
            replayed += 1
        if latest is not None or replayed:
            log.info(
                "recovered at versions %s with %d pending contributions", self.versions, replayed
            )

    def weights_sha256(self, uid: str) -> str:
        return weights_hash(self.published_module(uid))

    def close(self) -> None:
        """Close the journal file. Takes no checkpoint: what was accepted is durable
        already, and a restart replays it (so this is also what kill -9 leaves)."""
        if not self._journal._file.closed:
            self._journal.close()
