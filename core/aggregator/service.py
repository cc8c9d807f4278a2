"""The aggregator on the network: takes contributions over the RPC, runs rounds when they
are due, and says in the DHT which version of each expert is current."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any, Final

import torch
import trio

from core.aggregator.auditor import ContributionAuditor
from core.aggregator.core import AggregatorCore
from core.aggregator.evaluations import EvaluationRefused, EvaluationStore
from core.aggregator.verify import Rejected, check_payload
from core.experts.registry import build_expert
from core.experts.weights import save_weights
from core.experts.wire import from_wire, to_wire
from core.moe.answer_checks import recompute_rows
from core.project.chunks import ChunkStore, FileEntry, split_file
from core.protocol.aggregator_methods import (
    CONTRIBUTE,
    MAX_CONTRIBUTORS_LISTED,
    MAX_REFEREE_ROWS,
    REFEREE,
    REVEAL,
    STATS,
    AggregatorReport,
)
from core.protocol.contributions import TRUNK_UID, Contribution, MessageError
from core.protocol.credit import CREDIT, CreditStatement
from core.protocol.evaluations import EVALUATION, EVALUATIONS, MAX_POINTS_PER_REPLY, EvaluationPoint
from core.protocol.refusals import SLOW_DOWN, Refusal, is_offence
from core.protocol.signed_report import SignedReport
from core.protocol.versions import (
    CURRENT_VERSIONS,
    parse_versions_ask,
    version_key,
    versions_answer,
)
from net import (
    BadRequest,
    CallContext,
    DhtError,
    Peer,
    PeerID,
    RemoteError,
    Reply,
    RequestHead,
    Tensor,
    Unavailable,
)
from net.codec import pack
from net.identity import peer_id_from_public_key, public_key_of
from net.ratelimit import PeerRateLimiter, RateLimits

log = logging.getLogger(__name__)

#: Offending contributions one source address may send per second, and in a burst,
#: before its contributions are refused from the header on (``slow_down``: never a ban
#: of the address, which a home router or a carrier-grade NAT shares with honest
#: volunteers; refusals that are no offence do not count, core/protocol/refusals.py).
JUNK_PER_SECOND: Final = 1.0
JUNK_BURST: Final = 60.0
#: How often ended strikes and bans are forgotten.
PRUNE_SECONDS: Final = 60.0


class Refused(RemoteError):
    """A contribution was refused; the error code is the reason."""

    def __init__(self, reason: Refusal, detail: str) -> None:
        super().__init__(detail)
        self.code = reason  # type: ignore[misc]  # one code per reason, not per class


class AggregatorService:
    def __init__(
        self,
        peer: Peer,
        core: AggregatorCore,
        *,
        store: ChunkStore | None = None,
        version_ttl: float = 600.0,
        evaluations: EvaluationStore | None = None,
    ) -> None:
        self.peer = peer
        #: the trainers' signed evaluations (None: none kept, as in a bare test)
        self.evaluations = evaluations
        self.core = core
        self.store = store  # where new versions' chunks go, served by a WeightsService
        self.version_ttl = version_ttl
        self._engine = trio.CapacityLimiter(1)  # the core is used by one thread at a time
        # signatures, digests and decoding run outside the engine, one thread at a time
        self._checker = trio.CapacityLimiter(1)
        # offences per source address: a source that keeps sending junk (from any number
        # of throwaway identities) is refused from the header on, for a while
        self._junk: PeerRateLimiter[str] = PeerRateLimiter(
            RateLimits(requests_per_second=JUNK_PER_SECOND, request_burst=JUNK_BURST)
        )
        #: contributors (public keys) a project ban names, to be honoured by the loop
        self._bans: list[bytes] = []
        #: audits of accepted contributions (None: the project audits none)
        self.auditor: ContributionAuditor | None = None
        if core.settings.contribution_audit_rate > 0:
            self.auditor = ContributionAuditor(
                core, self._engine, rate=core.settings.contribution_audit_rate
            )
            peer.rpc.register(REVEAL, self.auditor.reveal)
        peer.rpc.register(CONTRIBUTE, self._contribute, screen=self._screen)
        peer.rpc.register(STATS, self._stats)
        peer.rpc.register(CREDIT, self._credit)
        peer.rpc.register(EVALUATION, self._evaluation)
        peer.rpc.register(EVALUATIONS, self._evaluations)
        peer.rpc.register(REFEREE, self._referee)
        peer.rpc.register(CURRENT_VERSIONS, self._current_versions)
        self._trainers = frozenset(peer_id_from_public_key(k) for k in core.settings.trainers)
        # a referee's recomputations, one at a time beside the rounds
        self._refereeing = trio.CapacityLimiter(1)
        self.refereed = 0
        #: per expert, the record last announced and when (it is put again before its
        #: ttl ends: an expert without rounds for a while keeps its version findable)
        self._announced: dict[str, tuple[float, bytes]] = {}

    def honour_ban(self, public_key: bytes) -> None:
        """Refuse this contributor from now on and drop what it has pending (the core is
        changed by the run loop, holding the engine)."""
        self._bans.append(public_key)

    async def run(
        self, *, task_status: trio.TaskStatus[AggregatorService] = trio.TASK_STATUS_IGNORED
    ) -> None:
        for uid in self.core.settings.uids:
            await self._announce_version(uid)
        async with trio.open_nursery() as nursery:
            if self.auditor is not None:
                await nursery.start(self.auditor.run)
            task_status.started(self)
            await self._rounds()

    async def _rounds(self) -> None:
        next_prune = trio.current_time() + PRUNE_SECONDS
        while True:
            while self._bans:
                key = self._bans.pop()
                await trio.to_thread.run_sync(self.core.ban_contributor, key, limiter=self._engine)
            for uid in self.core.settings.uids:
                if self.core.due(uid):
                    await trio.to_thread.run_sync(self.core.run_round, uid, limiter=self._engine)
                    await self._announce_version(uid)
            if trio.current_time() >= next_prune:
                next_prune = trio.current_time() + PRUNE_SECONDS
                self.core.prune(self.core.clock.wall())
            await self._refresh_versions()
            await trio.sleep(0.2)

    async def _refresh_versions(self) -> None:
        """Put again every version record a third of its ttl old: without it, an expert
        whose rounds wait (too few volunteers) vanished from the DHT after the ttl, and
        export, audits and volunteers fell back to its initial weights."""
        stale = trio.current_time() - self.version_ttl / 3
        for uid, (when, packed) in list(self._announced.items()):
            if when <= stale:
                await self._put_version(uid, packed)

    async def _announce_version(self, uid: str) -> None:
        """Say which version of ``uid`` is current, and where its weights are: the file's
        chunks are in our store, served by our WeightsService."""
        record: dict[str, Any] = {
            "uid": uid,
            "version": self.core.versions[uid],
            "sha256": self.core.weights_sha256(uid),
        }
        if self.store is not None:
            entry = await trio.to_thread.run_sync(self._export, uid, limiter=self._engine)
            record["file"] = [entry.sha256, entry.size, list(entry.chunks)]
        await self._put_version(uid, pack(record))

    async def _put_version(self, uid: str, packed: bytes) -> None:
        # remembered first: a failed put is tried again at the next refresh
        self._announced[uid] = (trio.current_time(), packed)
        try:
            await self.peer.dht.put(
                version_key(self.core.settings.project, uid), packed, self.version_ttl
            )
        except DhtError as exc:
            log.info("could not announce the version of %s: %s", uid, exc)

    async def _current_versions(self, ctx: CallContext) -> Reply:
        """The records last announced of the experts asked (those this aggregator holds):
        what the DHT holds under their keys, for one request instead of a lookup each."""
        try:
            project, uids = parse_versions_ask(ctx.request.meta)
        except MessageError as exc:
            raise BadRequest(str(exc)) from exc
        records = {}
        if project == self.core.settings.project:
            records = {u: self._announced[u][1] for u in uids if u in self._announced}
        blob = versions_answer(records)
        return Reply({}, (Tensor("uint8", (len(blob),), blob),))

    def _export(self, uid: str) -> FileEntry:
        assert self.store is not None
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{uid}.safetensors"
            module = self.core.published_module(uid)
            save_weights(module, path, version=self.core.versions[uid])
            return split_file(path.read_bytes(), self.store)

    def _decode(self, meta: Mapping[str, Any], peer_id: PeerID) -> Contribution:
        raw = meta.get("header")
        if not isinstance(raw, bytes):
            raise BadRequest("a contribution needs its header")
        try:
            contribution = Contribution.decode(raw)
        except MessageError as exc:
            raise Refused(Refusal.MALFORMED, str(exc)) from exc
        if peer_id != peer_id_from_public_key(contribution.contributor):
            raise Refused(
                Refusal.NOT_YOURS, "contributions are sent by the volunteer that signed them"
            )
        return contribution

    def _screen(self, head: RequestHead) -> RemoteError | None:
        """Refuse junk from its header, before its payload is buffered: a source that
        sent too much junk lately, a malformed header, or any claim that cannot hold
        (unknown expert, receipts of no trainer, a payload of the wrong size...)."""
        if self._junk_exhausted(head.source):
            return Refused(
                SLOW_DOWN, "too many invalid contributions from this address lately; later"
            )
        try:
            contribution = self._decode(head.meta, head.peer_id)
            # the connection proved the sender holds the contributor's key
            now = self.core.clock.wall()
            self.core.screen(
                contribution, now, payload_bytes=head.payload_bytes, authenticated=True
            )
        except Rejected as exc:
            if is_offence(exc.reason):
                self._count_junk(head.source)
            return Refused(exc.reason, str(exc))
        except RemoteError as exc:  # a header that is no contribution at all
            self._count_junk(head.source)
            return exc
        return None

    def _junk_exhausted(self, source: str) -> bool:
        return self._junk.exhausted(source, trio.current_time())

    def _count_junk(self, source: str) -> None:
        self._junk.admit(source, 0, trio.current_time())

    async def _contribute(self, ctx: CallContext) -> Reply:
        contribution = self._decode(ctx.request.meta, ctx.peer_id)
        parts: list[torch.Tensor] = [from_wire(t) for t in ctx.request.tensors]
        now = self.core.clock.wall()
        try:
            await trio.to_thread.run_sync(check_payload, contribution, parts, limiter=self._checker)
        except Rejected as exc:
            self.core.refused(contribution, exc, now, attributable=True)
            if is_offence(exc.reason):
                self._count_junk(ctx.source)
            raise Refused(exc.reason, str(exc)) from exc
        drawn = self.auditor is not None and self.auditor.draw(contribution)
        try:
            await trio.to_thread.run_sync(
                partial(self.core.accept, held=drawn),
                contribution,
                parts,
                now,
                limiter=self._engine,
            )
        except Rejected as exc:
            raise Refused(exc.reason, str(exc)) from exc
        if self.auditor is not None:
            self.auditor.accepted(contribution.nonce)
            if drawn:
                self.auditor.hold(contribution, parts)
        reply: dict[str, Any] = {"accepted": True, "version": self.core.versions[contribution.uid]}
        closes_in = self.core.closes_in(contribution.uid)
        if closes_in is not None:  # so that the volunteer sends again just before it closes
            reply["closes_in"] = round(closes_in, 3)
        return Reply({**reply, "audit": True} if drawn else reply)

    async def _referee(self, ctx: CallContext) -> Reply:
        """What the weights of an expert's version compute for a trainer's rows: the
        word that settles a dispute over a server's answer (core/moe/audit.py). Only
        the manifest's trainers may ask: the work is the aggregator's."""
        if ctx.peer_id not in self._trainers:
            raise BadRequest("only the project's trainers may ask the referee")
        meta = ctx.request.meta
        uid, version, kind = meta.get("uid"), meta.get("version"), meta.get("kind")
        if uid not in self.core.settings.uids or uid == TRUNK_UID:
            raise BadRequest(f"this aggregator holds no expert {uid!r}")
        if not isinstance(version, int) or kind not in ("forward", "backward"):
            raise BadRequest("a referee request names a version and a kind")
        tensors = [from_wire(t) for t in ctx.request.tensors]
        hidden = self.core.settings.spec.hidden
        if len(tensors) != (1 if kind == "forward" else 2) or any(
            t.ndim not in (2, 3)
            or t.shape[-1] != hidden
            or t.shape[0] > MAX_REFEREE_ROWS
            or t.shape != tensors[0].shape
            or not t.is_floating_point()
            for t in tensors
        ):
            raise BadRequest(
                f"a referee request carries inputs (and, backward, output gradients) of "
                f"the same shape: at most {MAX_REFEREE_ROWS} rows of {hidden}"
            )
        weights = await trio.to_thread.run_sync(
            self.core.weights_of, uid, version, limiter=self._engine
        )
        if weights is None:
            raise BadRequest(f"the weights of {uid} version {version} are gone here")
        spec = self.core.settings.spec

        def recompute() -> torch.Tensor:
            module = build_expert(spec)
            module.load_state_dict(weights)
            grad = tensors[1] if kind == "backward" else None
            return recompute_rows(module, kind, tensors[0], grad, spec.torch_dtype)

        expected = await trio.to_thread.run_sync(recompute, limiter=self._refereeing)
        self.refereed += 1
        return Reply({"version": version}, (to_wire(expected),))

    async def _stats(self, ctx: CallContext) -> Reply:
        """This aggregator's account, signed (core/protocol/signed_report.py)."""
        signed = SignedReport.sign(
            self.peer.identity,
            self.core.settings.project,
            self.statistics(),
            self.core.clock.wall(),
        )
        return Reply({"signed": signed.encode()})

    async def _evaluation(self, ctx: CallContext) -> Reply:
        """A trainer's signed evaluation, kept for anyone to read (the project page)."""
        if self.evaluations is None:
            raise Unavailable("this aggregator keeps no evaluations")
        if ctx.peer_id not in self._trainers:
            raise BadRequest("only the manifest's trainers send evaluations")
        try:
            point = EvaluationPoint.decode(ctx.request.meta.get("point"))
            if point.trainer != public_key_of(ctx.peer_id):
                raise EvaluationRefused("a trainer sends its own evaluations only")
            await trio.to_thread.run_sync(
                partial(self.evaluations.add, point, self.core.clock.wall()), limiter=self._checker
            )
        except (MessageError, EvaluationRefused) as exc:
            raise BadRequest(f"evaluation refused: {exc}") from exc
        return Reply({})

    async def _evaluations(self, ctx: CallContext) -> Reply:
        """The trainers' evaluations measured after ``after`` (anyone may ask)."""
        after = ctx.request.meta.get("after", 0.0)
        if isinstance(after, bool) or not isinstance(after, (int, float)):
            raise BadRequest("after is a time in seconds")
        if self.evaluations is None:
            return Reply({"points": [], "more": False})
        points, more = self.evaluations.after(float(after), MAX_POINTS_PER_REPLY)
        return Reply({"points": [p.encode() for p in points], "more": more})

    async def _credit(self, ctx: CallContext) -> Reply:
        """This aggregator's signed statement of a contributor's credit (anyone may ask:
        credit is public, and a statement proves only what it says)."""
        key = ctx.request.meta.get("contributor")
        if not isinstance(key, bytes) or len(key) != 32:
            raise BadRequest("a credit request names a contributor's 32-byte public key")
        statement = await trio.to_thread.run_sync(self.credit_statement, key, limiter=self._engine)
        return Reply({"statement": statement.encode()})

    def credit_statement(self, contributor: bytes) -> CreditStatement:
        """(Holding the engine.) What this aggregator's books say ``contributor`` earned."""
        who = contributor.hex()
        ledger = self.core.credit
        return CreditStatement.sign(
            self.peer.identity,
            self.core.settings.project,
            contributor,
            dict(ledger.days.get(who, {})),
            ledger.revoked.get(who, 0.0),
            self.core.clock.wall(),
        )

    def statistics(self) -> AggregatorReport:
        s = self.core.stats
        # the contributors with the most credit, then the most active (a reply stays
        # small in a big swarm; the project page's leaderboard is its head)
        credit = self.core.credit
        active = sorted(
            s.contributors.items(), key=lambda item: (-credit.total(item[0]), -item[1].accepted)
        )
        return AggregatorReport(
            accepted=s.accepted,
            rejected=dict(s.rejected),
            rounds=s.rounds,
            banned_peers=s.banned_peers,
            versions=dict(self.core.versions),
            contributors={
                who: c.report().model_copy(
                    update={
                        "credit": self.core.credit.total(who),
                        "credit_revoked": self.core.credit.revoked.get(who, 0.0),
                    }
                )
                for who, c in active[:MAX_CONTRIBUTORS_LISTED]
            },
            audits=None if self.auditor is None else self.auditor.stats.report(),
            pending_samples={
                uid: self.core.pending_samples(uid) for uid in self.core.settings.uids
            },
            short_of_contributors={
                uid: self.core.contributors_short(uid)
                for uid in self.core.settings.uids
                if self.core.stalled(uid)
            },
            **s.lateness_report(),
        )
