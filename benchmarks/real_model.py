"""A Mixtral-style model trained through the swarm and as ``transformers``' own
``MixtralForCausalLM`` in one process, on the same token batches (issue 38). One JSON line.

In one run:

1. **Data.** A byte-level BPE (``--vocab`` tokens, default 4096) learned from the first
   ``--tokenizer-mb`` of Python's standard library sources, and the first ``--text-mb``
   of them tokenized into token shards (``prepared_shards``, as a trainer does).
2. **(a) The swarm.** Real libp2p peers on loopback in this process: a bootstrap peer,
   the owner (``prepare`` + ``serve_project``), one aggregator (``aggregate``),
   ``--volunteers`` volunteers each serving every expert with real compute
   (``serve_project_experts``: receipts required, contributions, new versions pulled),
   and one trainer (``train_on`` on the shards) with ``TrainerOptions``' defaults
   (batch 16, rate 3e-3, one batch in flight, forward timeout 10 s; the manifest's
   ``[training.schedule]``, whose default is a constant rate clipped at 1.0). The
   experts learn at the aggregator, from the volunteers' gradients, in rounds
   (``settings`` in the JSON says every choice). After the last step the volunteers send
   what they hold and the rounds close; then ``export_project`` writes the model.
3. **(b) The reference.** The same initial weights (the trainer's layers of the
   manifest's seed and the experts' published initial weights, ``export_model`` ->
   ``MixtralForCausalLM.from_pretrained``), the same batches (``PackedLoader``, the same
   seed, rank 0 of 1, the same shards), AdamW at the same rate and schedule, the
   gradient clipped at the same norm (over every parameter: here the experts' are the
   model's too), every parameter stepped every step, with Mixtral's own loss (the
   cross-entropy plus the router's load-balancing loss at the manifest's weight).
   ``same_batches`` says whether its loader ended where the trainer's did.

torch computes with one thread (``--threads``): on a shared machine two threads of one
matmul waited on each other, a step 10x slower. Both runs are timed in this process.

Keys:

- ``swarm_loss`` / ``reference_loss``: the mean next-token cross-entropy (nats) of the
  exported swarm model and of the reference, both as ``MixtralForCausalLM``, on the same
  held-out windows; ``loss_ratio`` = swarm / reference (goal: <= 1.05 at equal tokens);
  ``swarm_trainer_loss``: the trainer's own last evaluation, through the swarm;
  ``initial_loss_swarm`` / ``initial_loss_reference``: both before training, on the
  trainer's evaluation windows (the same weights give the same loss);
- ``export_max_abs_logit_diff``: the exported folder loaded by ``from_pretrained``
  against moehome's model holding the same weights (the trainer's checkpoint and the
  exported expert versions, experts local) (goal: <= 1e-4);
- ``import_max_abs_logit_diff``: a random ``MixtralForCausalLM`` saved by
  ``transformers`` and read by ``load_pretrained`` (goal: <= 1e-4);
- ``loader_tokens_per_s``, ``raw_read_tokens_per_s``, ``loader_rss_mb_1x``,
  ``loader_rss_mb_10x``: benchmarks/data_loader.py, run as it runs (goals: the loader
  >= 0.5 of NumPy; the two memories within 10%);
- sizes, tokens, seconds and tokens per second of each run.

    python benchmarks/real_model.py [--steps 60] [--hidden 256] [--layers 4] ...
    python benchmarks/real_model.py --quick      # tiny sizes, for development
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import transformers
import trio
from transformers import MixtralConfig, MixtralForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.checkpoints import CheckpointStore
from core.data.loader import PackedLoader, SourceSpec
from core.data.shards import open_shards
from core.data.tokenizer import HFTokenizer, train_bpe
from core.demo.emulated_host import start_peer
from core.experts.registry import build_expert
from core.experts.server import ServerConfig
from core.experts.spec import seed_for
from core.experts.uid import Grid
from core.families.config import mixtral_config
from core.families.export import export_model
from core.families.load import load_pretrained
from core.families.mixtral import LocalGridMixture, MixtralLanguageModel
from core.families.routing import GridGate
from core.moe.published import PublishedWeights
from core.project.chunks import ChunkStore
from core.project.keys import OwnerKey
from core.project.manifest import Manifest
from core.project.publish import prepare, serve_project
from core.project.schedule import Schedule
from core.project.signed import SignedManifest
from core.roles.aggregator import aggregate
from core.roles.expert_server import serve_project_experts
from core.trainer.batches import open_batches, prepared_shards
from core.trainer.data import STDLIB, stdlib_sources
from core.trainer.events import Evaluated, TrainerEvent, TrainingProgressed
from core.trainer.export import export_project, trainer_layers
from core.trainer.family import MixtralTrainerModel, build_family_model
from core.trainer.train import TrainerOptions, train_on
from net import Peer

log = logging.getLogger("real_model")

DATA_LOADER = Path(__file__).resolve().parent / "data_loader.py"
MB = 2**20


@dataclass(frozen=True)
class Sizes:
    vocab: int = 4096
    hidden: int = 256
    inner: int = 512
    layers: int = 4
    experts: int = 8
    top_k: int = 2
    heads: int = 4
    kv_heads: int = 2
    context: int = 128


@dataclass(frozen=True)
class SwarmSettings:
    """The manifest's choices for a small swarm (the demo's rounds: core/demo/scenario.py)
    and how many volunteers serve."""

    volunteers: int = 3
    #: answers each token needs before the trainer goes on: every chosen expert's (the
    #: model is top-k; fewer would mix fewer experts than the reference)
    k_min: int = 2
    #: activations and their gradients on the wire: the manifest template's codec
    #: (8-bit blockwise, a quarter of float32's bytes)
    wire: str = "q8"
    optimizer: str = "adamw"
    #: the experts' rate: the trainer's (TrainerOptions' default), as in the reference
    learning_rate: float = 3e-3
    contribution_samples: int = 2048
    contribution_seconds: float = 4.0
    staleness_bound: int = 8
    round_samples: int = 6144
    round_seconds: float = 8.0
    #: the demo's rule: 3, or fewer when fewer volunteers serve an expert
    min_contributors: int = 3
    weights_seed: int = 1


@dataclass(frozen=True)
class Data:
    tokenizer: HFTokenizer
    shards: Path
    tokens: int
    text_bytes: int


def stdlib_texts(budget: int) -> Iterator[str]:
    """The standard library's sources, file by file in their sorted order, up to
    ``budget`` bytes of UTF-8 (what the BPE learns from)."""
    taken = 0
    for path in stdlib_sources():
        if taken >= budget:
            return
        text = path.read_text(encoding="utf-8", errors="replace")
        taken += len(text.encode("utf-8"))
        yield text


def prepare_data(folder: Path, vocab: int, tokenizer_bytes: int, text_bytes: int) -> Data:
    started = time.perf_counter()
    tokenizer = train_bpe(stdlib_texts(tokenizer_bytes), vocab, folder / "tokenizer.json")
    shards = prepared_shards(STDLIB, tokenizer, folder, max_bytes=text_bytes)
    _, index = open_shards(shards)
    assert index is not None
    tokens = index.tokens
    log.info(
        "BPE of %d tokens and %d tokens of shards in %.0f s",
        tokenizer.vocab_size,
        tokens,
        time.perf_counter() - started,
    )
    return Data(tokenizer, shards, tokens, text_bytes)


def manifest_text(
    sizes: Sizes,
    swarm: SwarmSettings,
    tokenizer: str,
    aggregator: tuple[str, str],
    trainer: str,
) -> str:
    """A mixtral project: a one-dimensional grid (the family's own router);
    [training.schedule] and [training.expert_schedule], the aggregation and the audits
    left at their defaults (constant rates, the trainer's clipped at 1.0; centered
    clipping; 5% of answers and of contributions recomputed)."""
    return f"""\
[project]
name = "real-model"

[model]
architecture = "mixtral"
vocab_size = {sizes.vocab}
hidden = {sizes.hidden}
context = {sizes.context}
mixture_layers = {sizes.layers}
grid = [{sizes.experts}]
k_best = {sizes.top_k}
k_min = {swarm.k_min}
heads = {sizes.heads}
kv_heads = {sizes.kv_heads}

[model.expert]
kind = "swiglu"
hidden = {sizes.hidden}
inner = {sizes.inner}

[model.wire]
activations = "{swarm.wire}"
gradients = "{swarm.wire}"

[data]
tokenizer = "{tokenizer}"

[training]
optimizer = "{swarm.optimizer}"
learning_rate = {swarm.learning_rate}
contribution_samples = {swarm.contribution_samples}
contribution_seconds = {swarm.contribution_seconds}
staleness_bound = {swarm.staleness_bound}
round_samples = {swarm.round_samples}
round_seconds = {swarm.round_seconds}
min_contributors = {swarm.min_contributors}

[[aggregators]]
key = "{aggregator[0]}"
addrs = ["{aggregator[1]}"]

[[trainers]]
key = "{trainer}"

[weights]
seed = {swarm.weights_seed}
"""


def local_model(
    manifest: Manifest,
    eos: int,
    experts: dict[str, torch.nn.Module] | None = None,
    trunk: dict[str, torch.Tensor] | None = None,
) -> MixtralTrainerModel:
    """The project's model with every expert in this process, routed by the top k of the
    full router (what ``transformers`` computes): the experts given, or their published
    initial weights; the trainer's layers given, or those of the manifest's seed."""
    m = manifest.model
    spec = m.expert_spec()
    seed = manifest.weights.seed

    def block(_layer: int, grid: Grid) -> LocalGridMixture:
        modules = [
            build_expert(spec, seed=seed_for(seed, str(u))) if experts is None else experts[str(u)]
            for u in grid
        ]
        return LocalGridMixture(GridGate(m.hidden, grid.shape), modules, m.k_best)

    model = build_family_model(m, block, seed=seed, eos_token_id=eos)
    if trunk is not None:
        state = model.state_dict()
        missing = [k for k in state if ".mlp.experts." not in k and k not in trunk]
        if missing:
            raise RuntimeError(f"the trainer's checkpoint lacks {missing[:3]}")
        model.load_state_dict({**state, **{k: trunk[k] for k in state if k in trunk}})
    model.train(False)
    return model


def max_logit_diff(a: torch.nn.Module, b: torch.nn.Module, tokens: torch.Tensor) -> float:
    a.train(False)
    b.train(False)
    with torch.no_grad():
        return float((a(tokens).logits - b(tokens).logits).abs().max())


def mean_loss(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The mean next-token cross-entropy (nats) of a ``transformers`` model."""
    model.train(False)
    total = 0.0
    with torch.no_grad():
        for x, y in batches:
            logits = model(input_ids=x, use_cache=False).logits
            total += float(
                torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
                )
            )
    return total / len(batches)


def loader_for(data: Data, sizes: Sizes, options: TrainerOptions) -> PackedLoader:
    """The trainer's batches as ``training_batches`` opens them (rank 0 of 1)."""
    return open_batches(
        [SourceSpec(data.shards)],
        tokenizer=data.tokenizer,
        vocab_size=sizes.vocab,
        context=sizes.context,
        batch_size=options.batch_size,
        seed=options.seed,
        rank=0,
        world=1,
    )


# ---------------------------------------------------------------------- (a) the swarm


async def swarm_run(
    sizes: Sizes,
    swarm: SwarmSettings,
    data: Data,
    options: TrainerOptions,
    workdir: Path,
) -> dict[str, Any]:
    """Train through a swarm of real peers; export; the figures."""
    async with trio.open_nursery() as nursery:
        boot = await start_peer(nursery, [])
        bootstrap = boot.addrs()[:1]
        aggregator = await start_peer(nursery, bootstrap)
        trainer = await start_peer(nursery, bootstrap)
        path = workdir / "owner" / "project.toml"
        path.parent.mkdir(parents=True)
        path.write_text(
            manifest_text(
                sizes,
                swarm,
                data.tokenizer.sha256,
                (aggregator.identity.public_key.hex(), aggregator.addrs()[0]),
                trainer.identity.public_key.hex(),
            )
        )
        prepared = await trio.to_thread.run_sync(
            prepare, path, OwnerKey.generate(), (), workdir / "owner"
        )
        signed = prepared.signed
        project = signed.project_id
        options = replace(options, project=project)
        owner = await start_peer(nursery, bootstrap)
        await nursery.start(serve_project, owner, prepared)
        await nursery.start(aggregate, aggregator, signed, workdir / "aggregator")
        uids = list(signed.manifest.model.expert_uids())

        def report(event: TrainerEvent) -> None:
            if isinstance(event, Evaluated):
                log.info("swarm evaluation at step %d: %.4f", event.step, event.loss)
            elif isinstance(event, TrainingProgressed):
                log.info(
                    "swarm step %d/%d: loss %.3f, %.2f samples/s, expert versions %d-%d",
                    event.step,
                    event.steps,
                    event.loss,
                    event.samples_per_s,
                    event.version_min,
                    event.version_max,
                )

        async with trio.open_nursery() as volunteers:
            for i in range(swarm.volunteers):
                peer = await start_peer(volunteers, bootstrap)
                await serve_project_experts(
                    volunteers,
                    peer,
                    project,
                    uids,
                    workdir / f"volunteer{i}",
                    ServerConfig(project=project),
                )
            log.info("%d volunteers serve the %d experts", swarm.volunteers, len(uids))
            summary = await train_on(
                trainer,
                options,
                data_dir=options.workdir,
                report=report,
                stop=trio.Event(),
            )
            log.info("swarm: %d steps in %.0f s", summary.steps, summary.seconds)
            # what the volunteers hold of the last steps goes out, as it would in a swarm
            # that goes on; then they leave and the last rounds close
            await trio.sleep(swarm.contribution_seconds + 1)
            volunteers.cancel_scope.cancel()
        await trio.sleep(swarm.round_seconds + 2)
        out = workdir / "export"
        started = time.perf_counter()
        exported = await export_project(trainer, signed, out, workdir=options.workdir)
        export_seconds = time.perf_counter() - started
        experts = await exported_experts(trainer, signed, exported.versions, workdir)
        nursery.cancel_scope.cancel()
    weights, step = trainer_layers(signed, options.workdir)
    latest = CheckpointStore(options.workdir / "checkpoints").latest()
    assert latest is not None
    return {
        "summary": summary.model_dump(),
        "manifest": signed.manifest,
        "export": out,
        "export_seconds": export_seconds,
        "trainer_step": step,
        "versions": exported.versions,
        "experts": experts,
        "trunk": weights,
        # the trainer's loader's cursor (in its checkpoint): where its batches ended
        "data_cursor": latest[1]["data"],
    }


async def exported_experts(
    peer: Peer, signed: SignedManifest, versions: dict[str, int], workdir: Path
) -> dict[str, torch.nn.Module]:
    """The weights of the very versions exported, fetched and checked against their
    signed records."""
    published = PublishedWeights(
        peer, signed, ChunkStore(workdir / "check-chunks"), max_bytes=2**62
    )
    experts: dict[str, torch.nn.Module] = {}
    for uid, version in versions.items():
        module = await published.module(uid, version)
        if module is None:
            raise RuntimeError(f"version {version} of {uid} is no longer to be had")
        experts[uid] = module
    return experts


# ---------------------------------------------------------------------- (b) the reference


def reference_run(
    model: MixtralForCausalLM,
    loader: PackedLoader,
    steps: int,
    *,
    learning_rate: float,
    schedule: Schedule,
) -> dict[str, Any]:
    """``steps`` steps of the session's optimizer, schedule and clipping on every
    parameter, with Mixtral's loss (cross-entropy + coef x load-balancing loss)."""
    coef = float(model.config.router_aux_loss_coef)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=learning_rate, weight_decay=schedule.weight_decay
    )
    model.train()
    losses: list[float] = []
    started = time.perf_counter()
    for step in range(steps):
        x, y = loader.next_batch()
        out = model(input_ids=x, use_cache=False, output_router_logits=coef > 0)
        logits = out.logits
        lm = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        objective = lm + coef * out.aux_loss if coef > 0 else lm
        model.zero_grad(set_to_none=True)
        objective.backward()
        if schedule.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), schedule.clip_norm)
        for group in optimizer.param_groups:
            group["lr"] = schedule.rate(learning_rate, step)
        optimizer.step()
        losses.append(float(lm.detach()))
        if (step + 1) % 10 == 0 or step + 1 == steps:
            recent = losses[-10:]
            log.info("reference step %d/%d: loss %.3f", step + 1, steps, sum(recent) / len(recent))
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "steps": steps, "samples": steps * loader.batch_size}


# ---------------------------------------------------------------------- figures


def import_diff(config: MixtralConfig, folder: Path, tokens: torch.Tensor, seed: int) -> float:
    """A random ``MixtralForCausalLM`` (transformers' own initialization) saved by
    ``save_pretrained`` and read by ``load_pretrained``: the largest logit difference."""
    torch.manual_seed(seed)
    theirs = MixtralForCausalLM(config)
    theirs.save_pretrained(folder)
    ours: MixtralLanguageModel = load_pretrained(folder)
    return max_logit_diff(theirs, ours, tokens)


def loader_figures(tokens: int, batches: int) -> dict[str, Any]:
    """benchmarks/data_loader.py as it runs (fresh processes, medians of three)."""
    out = subprocess.run(
        [sys.executable, str(DATA_LOADER), "--tokens", str(tokens), "--batches", str(batches)],
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def parameter_counts(config: MixtralConfig) -> dict[str, int]:
    expert = 3 * config.hidden_size * config.intermediate_size
    experts = expert * config.num_local_experts * config.num_hidden_layers
    with torch.device("meta"):
        total = sum(p.numel() for p in MixtralForCausalLM(config).parameters())
    return {
        "parameters": total,
        "expert_parameters": experts,
        "trainer_parameters": total - experts,
        "active_parameters": total
        - experts
        + expert * config.num_experts_per_tok * config.num_hidden_layers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Sizes()
    parser.add_argument("--steps", type=int, default=60, help="trainer steps of 16 sequences")
    parser.add_argument("--vocab", type=int, default=defaults.vocab)
    parser.add_argument("--hidden", type=int, default=defaults.hidden)
    parser.add_argument("--inner", type=int, default=defaults.inner)
    parser.add_argument("--layers", type=int, default=defaults.layers)
    parser.add_argument("--experts", type=int, default=defaults.experts)
    parser.add_argument("--top-k", type=int, default=defaults.top_k)
    parser.add_argument("--heads", type=int, default=defaults.heads)
    parser.add_argument("--kv-heads", type=int, default=defaults.kv_heads)
    parser.add_argument("--context", type=int, default=defaults.context)
    parser.add_argument("--volunteers", type=int, default=SwarmSettings().volunteers)
    parser.add_argument("--wire", default=SwarmSettings().wire, help="the manifest's codec")
    parser.add_argument("--tokenizer-mb", type=float, default=4.0)
    parser.add_argument("--text-mb", type=float, default=10.0)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--loader-tokens", type=int, default=20_000_000)
    parser.add_argument("--loader-batches", type=int, default=400)
    parser.add_argument("--threads", type=int, default=1, help="torch's threads per computation")
    parser.add_argument("--workdir", type=Path, help="keep the run's files here")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for development")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    # peers that left are dialled a while longer, and peers stopping refuse connections:
    # libp2p says so at every attempt
    for name in ("libp2p.transport.tcp", "libp2p.network.swarm"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    # one thread per computation: on a shared machine, torch's threads of one matmul
    # wait on each other (a step 10x slower at a load of 4 per core)
    torch.set_num_threads(args.threads)
    sizes = Sizes(
        vocab=args.vocab,
        hidden=args.hidden,
        inner=args.inner,
        layers=args.layers,
        experts=args.experts,
        top_k=args.top_k,
        heads=args.heads,
        kv_heads=args.kv_heads,
        context=args.context,
    )
    if args.quick:
        sizes = replace(sizes, vocab=512, hidden=64, inner=128, layers=2, context=32)
        args.steps, args.tokenizer_mb, args.text_mb, args.eval_batches = 6, 0.5, 1.0, 2
        args.loader_tokens, args.loader_batches = 1_000_000, 20
    swarm = SwarmSettings(
        volunteers=args.volunteers,
        min_contributors=min(3, max(1, args.volunteers)),
        wire=args.wire,
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="real-model-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result = run(args, sizes, swarm, workdir)
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result))


def run(
    args: argparse.Namespace, sizes: Sizes, swarm: SwarmSettings, workdir: Path
) -> dict[str, Any]:
    data = prepare_data(
        workdir / "data", sizes.vocab, int(args.tokenizer_mb * MB), int(args.text_mb * MB)
    )
    # the trainer's defaults, but for what a benchmark must say: its steps, no
    # evaluation or checkpoint on the way (one at the end), the CPU
    options = TrainerOptions(
        project="",  # the project's id, once swarm_run made it
        workdir=workdir / "trainer",
        data=str(data.shards),
        tokenizer=data.tokenizer.path,
        steps=args.steps,
        log_every=10,
        eval_every=10**9,
        checkpoint_every=10**9,
        device="cpu",
    )

    # (a) the swarm
    log.info("(a) the swarm: %d steps of %d sequences", args.steps, options.batch_size)
    project = trio.run(swarm_run, sizes, swarm, data, options, workdir / "swarm")
    summary: dict[str, Any] = project["summary"]
    manifest: Manifest = project["manifest"]
    m = manifest.model
    schedule = manifest.training.schedule.schedule()
    eos = data.tokenizer.eos_id
    config = mixtral_config(m, eos_token_id=eos)

    # the export: from_pretrained against moehome's model of the same weights
    exported = MixtralForCausalLM.from_pretrained(project["export"], dtype=torch.float32)
    ours = local_model(manifest, eos, experts=project["experts"], trunk=project["trunk"])
    validation = loader_for(data, sizes, options)
    held_out = validation.validation_batches(args.eval_batches)
    trainer_eval = validation.validation_batches(options.eval_batches)
    validation.close()
    export_diff = max_logit_diff(exported, ours, held_out[0][0])
    swarm_loss = mean_loss(exported, held_out)

    # (b) the reference: transformers' own class, from the same initial weights
    log.info("(b) the reference: %d steps", args.steps)
    initial = local_model(manifest, eos)
    init_folder = workdir / "initial"
    export_model(initial, init_folder)
    reference = MixtralForCausalLM.from_pretrained(init_folder, dtype=torch.float32)
    initial_reference = mean_loss(reference, trainer_eval)
    batches = loader_for(data, sizes, options)
    ref = reference_run(
        reference,
        batches,
        summary["steps"],
        learning_rate=options.learning_rate,
        schedule=schedule,
    )
    # the trainer's checkpoint keeps its loader's cursor: where the same batches end
    same_batches = batches.state_dict() == project["data_cursor"]
    batches.close()
    reference_loss = mean_loss(reference, held_out)

    # the import: a random MixtralForCausalLM saved by transformers, read by moehome
    imported = import_diff(config, workdir / "imported", held_out[0][0], seed=3)

    log.info("the loader: benchmarks/data_loader.py")
    loader = loader_figures(args.loader_tokens, args.loader_batches)

    tokens = summary["tokens"]
    reference_tokens = ref["samples"] * sizes.context
    return {
        "benchmark": "real_model",
        "sizes": {**asdict(sizes), **parameter_counts(config)},
        "data": {
            "tokenizer": "byte-level BPE learned from the standard library's sources",
            "tokenizer_text_bytes": int(args.tokenizer_mb * MB),
            "tokenizer_vocab": data.tokenizer.vocab_size,
            "shard_text_bytes": data.text_bytes,
            "shard_tokens": data.tokens,
            "eval_windows": sum(x.shape[0] for x, _ in held_out),
        },
        "settings": {
            "trainer": {
                "batch_size": options.batch_size,
                "learning_rate": options.learning_rate,
                "in_flight": options.in_flight,
                "forward_timeout": options.forward_timeout,
                "timeout_after_k_min": options.timeout_after_k_min,
                "seed": options.seed,
                "optimizer": "adamw (the session's)",
                "schedule": asdict(schedule),
            },
            "manifest": {
                "k_best": m.k_best,
                "k_min": m.k_min,
                "grid": m.grid,
                "wire": m.wire.model_dump(),
                "router_aux_loss": m.router_aux_loss,
                "training": manifest.training.model_dump(
                    exclude={"trunk", "schedule"}, mode="json"
                ),
                "weights_seed": manifest.weights.seed,
            },
            "torch_threads": torch.get_num_threads(),
            "volunteers": swarm.volunteers,
            "experts_per_volunteer": m.expert_count,
            "reference": "MixtralForCausalLM, AdamW on every parameter at the trainer's "
            "rate, schedule and clipping, every step",
        },
        "steps": summary["steps"],
        "swarm_tokens": tokens,
        "reference_tokens": reference_tokens,
        "swarm_seconds": round(summary["seconds"], 1),
        "reference_seconds": round(ref["seconds"], 1),
        "swarm_tokens_per_s": round(tokens / summary["seconds"], 1),
        "reference_tokens_per_s": round(reference_tokens / ref["seconds"], 1),
        "initial_loss_swarm": _round(summary["initial_loss"]),
        "initial_loss_reference": _round(initial_reference),
        "swarm_loss": _round(swarm_loss),
        "reference_loss": _round(reference_loss),
        "loss_ratio": _round(swarm_loss / reference_loss),
        "swarm_trainer_loss": _round(summary["final_loss"]),
        "same_batches": same_batches,
        "swarm_failed_steps": summary["failed_steps"],
        "swarm_expert_versions": [summary["version_min"], summary["version_max"]],
        "exported_expert_versions": [
            min(project["versions"].values()),
            max(project["versions"].values()),
        ],
        "swarm_calls": summary["calls"],
        "swarm_audits": summary.get("audits"),
        "export_seconds": round(project["export_seconds"], 2),
        "export_max_abs_logit_diff": float(f"{export_diff:.3g}"),
        "import_max_abs_logit_diff": float(f"{imported:.3g}"),
        "loader_tokens_per_s": loader["loader_tokens_per_s"],
        "raw_read_tokens_per_s": loader["raw_read_tokens_per_s"],
        "loader_vs_raw": loader["loader_vs_raw"],
        "loader_rss_mb_1x": loader["loader_rss_mb_1x"],
        "loader_rss_mb_10x": loader["loader_rss_mb_10x"],
        "loader_tokens_1x": loader["tokens_1x"],
        "goals": {
            "loss_ratio_le_1.05": swarm_loss / reference_loss <= 1.05,
            "export_diff_le_1e-4": export_diff <= 1e-4,
            "import_diff_le_1e-4": imported <= 1e-4,
            "loader_ge_half_raw": loader["loader_tokens_per_s"]
            >= 0.5 * loader["raw_read_tokens_per_s"],
            "loader_rss_within_10pct": abs(loader["loader_rss_mb_10x"] - loader["loader_rss_mb_1x"])
            <= 0.1 * loader["loader_rss_mb_1x"],
        },
    }


def _round(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else round(value, 4)


if __name__ == "__main__":
    main()
