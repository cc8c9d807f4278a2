"""``moehome owner train``: a trainer of a project. Joins the swarm, checks that this
computer may sign receipts for the project, loads the data, and trains: the trainer-side
layers here, the mixture layers through the volunteers' experts (every backward request
carries a signed receipt, which is what lets the volunteers' gradients count).

Progress goes to ``report`` as plain dicts (the CLI prints them, as text or JSON lines);
the state is checkpointed every ``checkpoint_every`` steps and on the way out, and a
restart with the same work folder resumes from it. SIGINT and SIGTERM stop after the
step in flight, with a final evaluation and checkpoint.
"""

from __future__ import annotations

import logging
import math
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
import trio

from core.clock import SYSTEM_CLOCK, Clock
from core.errors import UserFacingError
from core.experts.uid import ExpertUID, Grid
from core.moe.answer_checks import Answer, Finding
from core.moe.audit import AnswerAuditor
from core.moe.client import ExpertCaller, Portal, ReceiptSigner
from core.moe.finder import ExpertFinder
from core.moe.load import ServerLoads
from core.moe.mixture import MoEConfig, RemoteMixtureOfExperts
from core.moe.published import PublishedWeights
from core.moe.voices import ExpertVoices
from core.namespaces import moehome_validator
from core.project.assignment import expert_assignment
from core.project.bans import BanBoard
from core.project.chunks import ChunkStore
from core.project.distribution import ProjectNotFound, find_manifest
from core.project.manifest import Manifest, ModelSection
from core.project.owner import aggregator_statistics, why_experts_wait
from core.project.pins import PinStore
from core.project.signed import SignedManifest
from core.project.versions import VersionFinder, pull_interval
from core.protocol.aggregator_methods import responsible_aggregator
from core.trainer.batches import (
    Batches,
    CorpusBatches,
    DataDescription,
    shard_folders,
    training_batches,
)
from core.trainer.concurrency import batches_in_flight
from core.trainer.data import DEFAULT_MAX_BYTES, STDLIB, Corpus
from core.trainer.evaluations import EvaluationPublisher
from core.trainer.events import (
    Evaluated,
    ExpertsNote,
    TrainerEvent,
    TrainingProgressed,
    TrainingStarted,
    TrainingSummary,
    Waiting,
)
from core.trainer.initial import start_from_published
from core.trainer.model import TrainerModel, build_model
from core.trainer.session import SessionSettings, TrainingSession
from core.trainer.settle import NewestVersion, Stalled, await_next_round
from core.trainer.sharing import TrunkSharing
from core.trainer.tokenizer_file import tokenizer_for
from core.trainer.trunk import shares_trunk
from net import Identity, Peer, PeerID, network_config
from net.identity import peer_id_from_public_key
from net.transport import DEFAULT_LISTEN

log = logging.getLogger(__name__)

Report = Callable[[TrainerEvent], None]


@dataclass(frozen=True)
class TrainerOptions:
    project: str
    workdir: Path
    #: a text folder or file, ``stdlib``, token shards; several (``PATH@WEIGHT``): a
    #: weighted mixture (token shards or text of a ``mixtral`` project)
    data: str | Path | tuple[str, ...] = STDLIB
    #: the project's tokenizer.json (a ``mixtral`` project with a pinned tokenizer,
    #: when the data are not shards that keep it beside them)
    tokenizer: Path | None = None
    steps: int = 1000
    batch_size: int = 16
    learning_rate: float = 3e-3
    log_every: int = 10
    eval_every: int = 100
    eval_batches: int = 4
    checkpoint_every: int = 50
    seed: int = 0
    max_data_bytes: int = DEFAULT_MAX_BYTES
    forward_timeout: float = 10.0
    #: once every token has k_min answers, how long to wait for the other experts
    timeout_after_k_min: float = 0.5
    #: give up when no step has succeeded for this long (no volunteers serve the project)
    patience_s: float = 600.0
    #: where the trainer-side layers run: "auto" (a GPU when torch sees one), "cpu", "cuda:0"
    device: str = "auto"
    #: batches carried through the swarm at once (core/trainer/session.py)
    in_flight: int = 1
    #: before the final evaluation, wait up to this long for the experts' round after
    #: the last step (core/trainer/settle.py); 0: evaluate at once
    final_round_wait_s: float = 0.0
    #: carry one batch at first and more, up to ``in_flight``, as the gradient noise
    #: scale grows (core/trainer/concurrency.py); False: ``in_flight`` from the start
    ramp_in_flight: bool = False

    def backward_timeout(self) -> float:
        """A backward call computes twice a forward's rows: twice its deadline."""
        return 2 * self.forward_timeout


def mixture_config(model: ModelSection, options: TrainerOptions) -> MoEConfig:
    """The mixtures' deadlines, the same as their callers': a layer's backward pass may
    take as long as one call's (twice a forward's). Before, the layer gave up after
    MoEConfig's 20 s whatever ``forward_timeout`` said: with 2 batches in flight on 4
    slow volunteers every backward pass took longer, and every step failed."""
    return MoEConfig(
        k_best=model.k_best,
        k_min=model.k_min,
        forward_timeout=options.forward_timeout,
        timeout_after_k_min=options.timeout_after_k_min,
        backward_timeout=options.backward_timeout(),
    )


def resolve_device(name: str) -> str:
    """``auto`` -> "cuda" when torch sees a GPU, else "cpu"; other names are checked."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UserFacingError(f"--device {name!r}: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserFacingError(f"--device {name}: torch sees no CUDA GPU here (a CPU-only build?)")
    if device.type not in ("cpu", "cuda"):
        raise UserFacingError(f"--device {name}: use auto, cpu or cuda[:N]")
    return str(device)


def check_trainer(signed: SignedManifest, identity: Identity) -> None:
    keys = {bytes.fromhex(t.key) for t in signed.manifest.trainers}
    if identity.public_key not in keys:
        raise UserFacingError(
            f"this computer's key {identity.public_key.hex()} is not a trainer of project "
            f"{signed.project_id}: add it to the manifest's [[trainers]] and publish again "
            "(volunteers refuse backward requests without a trainer's signed receipt)"
        )


def trainer_share(manifest: Manifest, identity: Identity) -> tuple[int, int]:
    """(rank, world): this trainer's place among the manifest's trainers, whose data
    shares are disjoint (one trainer alone, or a key not listed: the whole)."""
    keys = [t.key for t in manifest.trainers]
    mine = identity.public_key.hex()
    return (keys.index(mine), len(keys)) if mine in keys else (0, 1)


def remote_model(
    peer: Peer,
    signed: SignedManifest,
    identity: Identity,
    options: TrainerOptions,
    auditor: AnswerAuditor | None = None,
    board: BanBoard | None = None,
    eos_token_id: int | None = None,
) -> Callable[[], TrainerModel]:
    """Builds the trainer's model (as often as batches in flight need copies): the same
    trainer-side weights each time; every copy's mixture of a layer shares that layer's
    expert finder and caller (one view of the swarm, one set of statistics). With an
    ``auditor``, a share of the answers is recomputed, and who fails is never called
    again."""
    m = signed.manifest.model
    config = mixture_config(m, options)
    portal = Portal.current()
    signer = ReceiptSigner(identity, signed.project_id)
    grids = m.grids()
    finders = [ExpertFinder(peer.dht, signed.project_id, grid) for grid in grids]
    loads = ServerLoads()  # one volunteer's device serves every layer's calls
    training = signed.manifest.training
    voices = ExpertVoices(training.min_contributors, half_life_rows=training.round_samples)
    callers = [
        ExpertCaller(
            peer.rpc,
            forward_timeout=options.forward_timeout,
            backward_timeout=options.backward_timeout(),
            receipts=signer,
            codecs=m.wire.codecs(),
            dtype=m.expert_spec().torch_dtype,
            loads=loads,
            auditor=auditor,
            voices=voices,
        )
        for _ in grids
    ]

    def exclude(peer_id: PeerID, seconds: float = math.inf) -> None:
        for finder in finders:
            finder.exclude(peer_id, seconds)

    async def second_opinion(
        answer: Answer, asked: set[PeerID]
    ) -> tuple[PeerID, torch.Tensor] | None:
        uid = ExpertUID.parse(answer.uid)
        layer = next(i for i, grid in enumerate(grids) if uid in grid)
        servers = await finders[layer].servers(answer.uid)
        return await callers[layer].opinion(answer, servers, asked)

    aggregators = [
        peer_id_from_public_key(bytes.fromhex(a.key)) for a in signed.manifest.aggregators
    ]
    assignment = expert_assignment(signed.manifest)

    async def referee(answer: Answer) -> torch.Tensor | None:
        if not aggregators:
            return None
        uid = ExpertUID.parse(answer.uid)
        layer = next(i for i, grid in enumerate(grids) if uid in grid)
        return await callers[layer].referee(
            answer, responsible_aggregator(answer.uid, aggregators, assignment)
        )

    if auditor is not None:
        auditor.second_opinion = second_opinion
        auditor.referee = referee
        auditor.exclusion_listeners.append(exclude)
    if board is not None:
        board.listeners.append(lambda ban: exclude(PeerID.from_base58(ban.peer)))

    family = m.architecture != "byte"

    def mixture(layer: int, grid: Grid) -> RemoteMixtureOfExperts:
        return RemoteMixtureOfExperts(
            in_features=m.hidden,
            grid=grid,
            finder=finders[layer],
            caller=callers[layer],
            portal=portal,
            config=config,
            own_gate=not family,  # a family's blocks have the family's gate
        )

    seed = signed.manifest.weights.seed
    if family:
        from core.trainer.family import build_family_model, remote_blocks

        blocks = remote_blocks(mixture, m.hidden)
        return lambda: build_family_model(m, blocks, seed=seed, eos_token_id=eos_token_id)
    return lambda: build_model(m, mixture, seed=seed)


async def run_trainer(
    identity: Identity,
    options: TrainerOptions,
    *,
    data_dir: Path,
    listen: Sequence[str] | None = None,
    bootstrap: Sequence[str] = (),
    report: Report,
) -> TrainingSummary:
    """Train until ``options.steps`` or a stop signal; the summary (also reported)."""
    config = network_config(listen or DEFAULT_LISTEN, bootstrap)
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(Peer(identity, config, validator=moehome_validator()).run)
        stop = trio.Event()
        nursery.start_soon(_stop_on_signals, stop)
        summary = await train_on(peer, options, data_dir=data_dir, report=report, stop=stop)
        nursery.cancel_scope.cancel()
    return summary


async def train_on(
    peer: Peer,
    options: TrainerOptions,
    *,
    data_dir: Path,
    report: Report,
    stop: trio.Event,
    corpus: Corpus | None = None,
) -> TrainingSummary:
    """The trainer on a running ``peer`` (whose identity must be a trainer of the
    project), until ``options.steps`` or ``stop``; the summary (also reported).
    ``corpus``: the byte model's data, when already loaded (else ``options.data`` is)."""
    identity = peer.identity
    signed = await _find_manifest(peer, options.project, data_dir)
    check_trainer(signed, identity)
    m = signed.manifest.model
    if m.architecture == "byte" and m.vocab_size < 256:
        raise UserFacingError(
            f"the byte model reads bytes (256 symbols); model.vocab_size is {m.vocab_size}"
        )
    rank, world = trainer_share(signed.manifest, identity)
    eos: int | None = None
    if corpus is not None:
        data: Batches = CorpusBatches(corpus, options.batch_size, m.context, options.seed)
        described = DataDescription(corpus.source, corpus.total_bytes, corpus.files)
    else:
        sources = (options.data,) if isinstance(options.data, str | Path) else options.data
        items = [str(s) for s in sources]
        # the pinned tokenizer.json: given, beside the shards, kept, or from the swarm
        tokenizer_file = await tokenizer_for(
            peer,
            signed,
            options.workdir,
            given=options.tokenizer,
            beside=await trio.to_thread.run_sync(shard_folders, items),
            store=options.workdir / "trunk-chunks",
        )
        data, described, tokenizer = await trio.to_thread.run_sync(
            partial(
                training_batches,
                m.architecture,
                m.vocab_size,
                signed.manifest.data.tokenizer,
                items,
                tokenizer_file=tokenizer_file,
                workdir=options.workdir,
                max_bytes=options.max_data_bytes,
                context=m.context,
                batch_size=options.batch_size,
                seed=options.seed,
                rank=rank,
                world=world,
            )
        )
        eos = None if tokenizer is None else tokenizer.eos_id
    audits = signed.manifest.training.audit
    auditor, weights = None, None
    if audits.answer_rate > 0:
        weights = PublishedWeights(
            peer,
            signed,
            ChunkStore(options.workdir / "audit-chunks"),
            max_bytes=audits.weights_mib * 2**20,
            interval=pull_interval(signed.manifest.training.round_seconds),
        )
        auditor = AnswerAuditor(
            weights,
            m.expert_spec().torch_dtype,
            rate=audits.answer_rate,
            row_share=audits.answer_rows,
        )
    # the project's bans: ours (an audit this trainer failed) published, the manifest's
    # other trainers' and aggregators' honoured
    board = BanBoard(peer, signed, interval=pull_interval(signed.manifest.training.round_seconds))
    if auditor is not None:
        auditor.listeners.append(partial(_accuse, board))
    build = remote_model(peer, signed, identity, options, auditor, board, eos)
    session = TrainingSession(
        build(),
        data,
        SessionSettings(
            project=signed.project_id,
            batch_size=options.batch_size,
            learning_rate=options.learning_rate,
            eval_batches=options.eval_batches,
            seed=options.seed,
            device=resolve_device(options.device),
            in_flight=options.in_flight,
            schedule=signed.manifest.training.schedule.schedule(),
            optimizer=signed.manifest.training.trainer_optimizer,
        ),
        options.workdir / "checkpoints",
        replica=build,
    )
    resumed = await trio.to_thread.run_sync(session.restore)
    if not resumed:  # replicas and the shared trunk's anchor copy the master's weights
        await start_from_published(peer, signed, session.model, options.workdir / "trunk-chunks")
    report(
        TrainingStarted(
            project=signed.project_id,
            name=signed.manifest.project.name,
            data=described.source,
            data_bytes=described.bytes,
            files=described.files,
            data_tokens=described.tokens,
            resumed_at_step=session.state.step if resumed else None,
            steps=options.steps,
            peer=str(peer.peer_id),
            device=str(session.device),
        )
    )
    sharing = (
        TrunkSharing(peer, signed, session, options.workdir / "trunk-chunks")
        if shares_trunk(signed.manifest)
        else None
    )
    # each evaluation, signed, to the aggregators: the project page's loss over time
    publisher = EvaluationPublisher(peer, signed)

    def reporting(event: TrainerEvent) -> None:
        report(event)
        if isinstance(event, Evaluated):
            samples = session.state.samples
            publisher.publish(
                step=event.step, samples=samples, tokens=samples * m.context, loss=event.loss
            )

    async with trio.open_nursery() as nursery:
        await nursery.start(publisher.run)
        if sharing is not None:
            nursery.start_soon(sharing.run)
        await nursery.start(board.run)
        if auditor is not None and weights is not None:
            await nursery.start(auditor.run)
            await nursery.start(weights.watch)
        nursery.start_soon(_watch_experts, peer, signed, report)
        # the layers' finders serve expired lookups while they look again behind them
        for finder in {id(m.finder): m.finder for m in session.mixtures()}.values():
            await nursery.start(finder.keep_fresh)
        versions = VersionFinder.for_manifest(peer, signed)

        async def newest(uid: str) -> int | None:
            record = (await versions.newest([uid]))[uid]
            return None if record is None else record.version

        async def stalled() -> frozenset[str]:
            accounts = await aggregator_statistics(peer, signed)
            return frozenset(
                uid for a in accounts if a.report for uid in a.report.short_of_contributors
            )

        summary = await _train(
            session,
            options,
            stop,
            reporting,
            sharing,
            newest=newest,
            stalled=stalled,
            pull_s=pull_interval(signed.manifest.training.round_seconds),
            trainers=world,
        )
        began = trio.current_time()
        await publisher.close()  # the final evaluation's point on its way
        log.info("evaluations sent to the aggregators (%.1f s)", trio.current_time() - began)
        nursery.cancel_scope.cancel()
    if auditor is not None:
        summary["audits"] = auditor.stats.as_dict()
    summary["banned"] = {peer: ban.reason for peer, ban in board.banned().items()}
    if sharing is not None:
        summary["trunk"] = {
            "version": sharing.sync.version,
            "changes_sent": sharing.sent,
            "changes_accepted": sharing.accepted,
            "rebased": sharing.rebased,
        }
    summary["aggregators"] = [a.to_obj() for a in await aggregator_statistics(peer, signed)]
    summary["reached"] = {p: how_reached(peer, p) for p in summary["answered_by"]}
    typed = TrainingSummary.model_validate(summary)
    report(typed)
    return typed


def _accuse(board: BanBoard, finding: Finding) -> None:
    """Publish the ban of a volunteer whose answer failed an audit against the published
    weights, with its signed statement of that answer. Other servers' verdicts (a
    quorum) ban nobody: two free identities that agree could otherwise ban anyone."""
    if finding.by_quorum:
        return
    answer, evidence = finding.answer, finding.answer.evidence
    board.accuse(
        str(answer.server),
        f"its {answer.kind} answer of {answer.uid} (version {answer.version}) is not what "
        f"those weights compute ({finding.excess:.3g} x an honest answer's bound)"
        if evidence is not None
        else f"its {answer.kind} answer of {answer.uid} came without a matching signature",
        b"" if evidence is None else evidence.statement.encode(),
        finding.excess,
    )


#: How often the trainer asks the aggregators why the experts' versions do not move.
EXPERTS_CHECK_S = 60.0


async def _watch_experts(
    peer: Peer, signed: SignedManifest, report: Report, every: float = EXPERTS_CHECK_S
) -> None:
    """Say why the experts do not learn when they do not (a round short of volunteers,
    an aggregator out of reach), and when that ends: an "experts" event each time the
    answer changes (the trainer-side layers learn either way)."""
    said = ""
    manifest = signed.manifest
    while True:
        await trio.sleep(every)
        note = why_experts_wait(
            await aggregator_statistics(peer, signed), manifest.training.min_contributors
        )
        if note != said:
            report(ExpertsNote(note=note))
            said = note


def how_reached(peer: Peer, server: str) -> str:
    """How we reach ``server`` now: "direct", "relayed" (only through a relay: its NAT
    defeated hole punching) or "not connected"."""
    try:
        peer_id = PeerID.from_base58(server)
    except ValueError:
        return "not connected"
    if not peer.host.is_connected(peer_id):
        return "not connected"
    return "relayed" if peer.host.relayed_only(peer_id) else "direct"


async def _find_manifest(peer: Peer, project: str, data_dir: Path) -> SignedManifest:
    """The project's manifest; retried for a minute (just after the owner published it,
    or while the swarm is busy, a lookup can come back empty)."""
    pins = PinStore(data_dir / "pinned-owners.json")
    deadline = trio.current_time() + 60
    while True:
        try:
            return await find_manifest(peer, project, pins)
        except ProjectNotFound:
            if trio.current_time() > deadline:
                raise
            log.info("no manifest of %s found yet; looking again", project)
            await trio.sleep(2)


async def _stop_on_signals(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("signal %d: stopping after the step in flight", signum)
            stop.set()


async def _train(
    session: TrainingSession,
    options: TrainerOptions,
    stop: trio.Event,
    report: Report,
    sharing: TrunkSharing | None = None,
    clock: Clock = SYSTEM_CLOCK,
    *,
    newest: NewestVersion | None = None,
    stalled: Stalled | None = None,
    pull_s: float = 0.0,
    trainers: int = 1,
) -> dict[str, Any]:
    """The training loop; ``clock`` times its windows, patience and speed (tests move
    one by hand). ``newest``: the experts' declared versions, for the wait before the
    final evaluation (``options.final_round_wait_s``; volunteers pull every ``pull_s``)."""
    state = session.state
    evaluating = trio.Lock()  # one evaluation at a time (they share a replica)
    if state.initial_loss is None:
        first = await _evaluate_until_answered(session, stop, options.patience_s, clock)
        report(Evaluated(step=state.step, loss=first))
    started = clock.monotonic()
    first_samples = state.samples
    window_start, window_samples = clock.monotonic(), state.samples
    answered_before = dict(session.swarm_view()["answered_by"])
    losses: list[float] = []
    last_success = clock.monotonic()
    carried = 0  # batches started and not finished: together with the steps, the limit
    # workers at or past this many wait (ramp_in_flight: it follows the noise scale)
    carrying = 1 if options.ramp_in_flight else session.in_flight
    carrying_sum, carrying_steps = 0, 0  # the limit at each applied step: its mean
    limit_moved = trio.Event()
    reached = carrying

    def follow_noise_scale() -> None:
        nonlocal carrying, limit_moved, reached
        noise = session.noise
        now = batches_in_flight(
            noise.sequences, noise.pairs, options.batch_size, trainers, carrying, session.in_flight
        )
        if now != carrying:
            log.info(
                "carrying %d batches at once (gradient noise scale ~%.0f sequences)",
                now,
                noise.sequences or 0.0,
            )
            carrying, reached = now, max(reached, now)
            limit_moved.set()  # a worker past a lowered limit waits at its next batch
            limit_moved = trio.Event()

    async def after_step(step: int) -> None:
        nonlocal window_start, window_samples, answered_before
        if step % options.log_every == 0:
            view = session.swarm_view()
            now = clock.monotonic()
            versions = list(view["versions"].values()) or [0]
            report(
                TrainingProgressed(
                    step=step,
                    steps=options.steps,
                    loss=sum(losses) / max(len(losses), 1),
                    samples=state.samples,
                    samples_per_s=(state.samples - window_samples) / max(now - window_start, 1e-9),
                    volunteers=sum(
                        1
                        for peer, n in view["answered_by"].items()
                        if n > answered_before.get(peer, 0)
                    ),
                    version_min=min(versions),
                    version_max=max(versions),
                    failed_steps=state.failed_steps,
                    stale_steps=state.stale_steps,
                    answered_by=dict(view["answered_by"]),
                    noise_scale=session.noise.sequences,
                    in_flight=carrying,
                )
            )
            losses.clear()
            window_start, window_samples = now, state.samples
            answered_before = dict(view["answered_by"])
        if step % options.eval_every == 0:
            async with evaluating:
                report(Evaluated(step=step, loss=await _evaluate(session)))
        if step % options.checkpoint_every == 0:
            await trio.to_thread.run_sync(session.save)

    async def carry(worker: int) -> None:
        """Batches one after another on ``worker``'s replica, until the steps are done."""
        nonlocal carried, last_success, carrying_sum, carrying_steps
        while state.step + carried < options.steps and not stop.is_set():
            if worker >= carrying:  # not yet: wait until the ramp reaches this worker
                with trio.move_on_after(1.0):  # and look at the steps and stop again
                    await limit_moved.wait()
                continue
            carried += 1
            try:
                result = await trio.to_thread.run_sync(session.step_on, worker)
            finally:
                carried -= 1
            if result is None:
                if clock.monotonic() - last_success > options.patience_s:
                    raise UserFacingError(
                        f"no training step succeeded for {options.patience_s:.0f} s: "
                        "no volunteer serves this project's experts"
                    )
                report(Waiting(step=state.step, failed_steps=state.failed_steps))
                await trio.sleep(1.0)  # the swarm is short of experts; give it a moment
                continue
            if not result.applied:
                continue  # too stale: dropped, the next batch starts from newer weights
            last_success = clock.monotonic()
            carrying_sum, carrying_steps = carrying_sum + carrying, carrying_steps + 1
            losses.append(result.loss)
            if options.ramp_in_flight:
                follow_noise_scale()
            if sharing is not None:
                sharing.stepped(options.batch_size)
            await after_step(result.step)

    async with trio.open_nursery() as nursery:
        for worker in range(session.in_flight):
            nursery.start_soon(carry, worker)
    elapsed = clock.monotonic() - started
    final = (
        state.evaluations[-1][1]
        if state.evaluations and state.evaluations[-1][0] == state.step
        else None
    )
    settled = None
    if options.final_round_wait_s > 0 and newest is not None and not stop.is_set():
        served = dict(session.swarm_view()["versions"])
        log.info(
            "waiting up to %.0f s for the experts' round after the last step",
            options.final_round_wait_s,
        )
        waited = trio.current_time()
        settled = await await_next_round(
            served,
            newest,
            options.final_round_wait_s,
            pull_s,
            stalled=stalled,
            round_s=2 * pull_s,  # a round later the volunteers' last contributions are in
        )
        if sharing is not None:  # and the trunk: a version holding this trainer's last change
            left = options.final_round_wait_s - (trio.current_time() - waited)
            with trio.move_on_after(max(0.0, left)) as scope:
                await sharing.settle()
            trunk_settled = not scope.cancelled_caught
            if not trunk_settled:
                log.info("the trunk had no version holding this trainer's last change in time")
            settled = replace(settled, applied=settled.applied and trunk_settled)
        final = None  # the weights changed since any evaluation made before
    if final is None:
        began = trio.current_time()
        final = await _evaluate(session)
        log.info("final evaluation: loss %.4f (%.1f s)", final, trio.current_time() - began)
        report(Evaluated(step=state.step, loss=final))
    began = trio.current_time()
    await trio.to_thread.run_sync(session.save)
    log.info("checkpoint at step %d saved (%.1f s)", state.step, trio.current_time() - began)
    view = session.swarm_view()
    versions = list(view["versions"].values()) or [0]
    trained = state.samples - first_samples
    wire, as_float32 = session.wire_bytes()
    return {
        "steps": state.step,
        "samples": state.samples,
        "tokens": state.samples * session.context,
        "seconds": elapsed,
        "samples_per_s": trained / elapsed if elapsed > 0 else 0.0,
        "initial_loss": state.initial_loss,
        "final_loss": final,
        "failed_steps": state.failed_steps,
        "in_flight": session.in_flight,
        "in_flight_reached": reached,
        "in_flight_end": carrying,
        "in_flight_mean": carrying_sum / carrying_steps if carrying_steps else float(carrying),
        "stale_steps": state.stale_steps,
        "staleness": {str(k): v for k, v in sorted(state.staleness.items())},
        "stopped_early": state.step < options.steps,
        "volunteers_answered": len(view["answered_by"]),
        "noise_scale": session.noise.sequences,
        "final_round": None
        if settled is None
        else {"applied": settled.applied, "seconds": settled.seconds, "behind": settled.behind},
        "answered_by": view["answered_by"],
        "version_min": min(versions),
        "version_max": max(versions),
        "calls": {
            "expert_calls": sum(m.stats.expert_calls for m in session.mixtures()),
            "failed_calls": sum(m.stats.failed_calls for m in session.mixtures()),
            "late_calls": sum(m.stats.late_calls for m in session.mixtures()),
            "forward_rows": sum(m.stats.forward_rows for m in session.mixtures()),
            "late_rows": sum(m.stats.late_rows for m in session.mixtures()),
            "backward_rows": sum(m.stats.backward_rows for m in session.mixtures()),
            # where the applied steps' seconds went: waiting on the swarm (summed over
            # the mixture layers and the batches) and the steps' whole time
            "plan_s": sum(m.stats.plan_s for m in session.mixtures()),
            "forward_s": sum(m.stats.forward_s for m in session.mixtures()),
            "backward_s": sum(m.stats.backward_s for m in session.mixtures()),
            "step_s": state.train_seconds,
            "steps": state.step,  # as step_s, kept across a resume (staleness is not)
            # activations and their gradients on the wire, per sample and over float32's
            "activation_bytes_per_sample": wire / max(trained, 1),
            "activation_bytes_ratio": wire / max(as_float32, 1),
        },
    }


async def _evaluate(session: TrainingSession) -> float:
    return await trio.to_thread.run_sync(session.evaluate)


async def _evaluate_until_answered(
    session: TrainingSession, stop: trio.Event, patience_s: float, clock: Clock = SYSTEM_CLOCK
) -> float:
    """The first evaluation waits for the swarm (volunteers may still be starting)."""
    deadline = clock.monotonic() + patience_s
    told = False
    while True:
        loss = await _evaluate(session)
        if not math.isnan(loss) or stop.is_set():
            return loss
        if not told:  # the normal start of a project: said once, not as a warning
            log.info(
                "waiting for volunteers to answer the first evaluation (%s)",
                session.evaluation_error,
            )
            told = True
        if clock.monotonic() > deadline:
            raise UserFacingError(
                f"the swarm answered no evaluation for {patience_s:.0f} s: "
                "no volunteer serves this project's experts"
            )
        await trio.sleep(1.0)
