"""``moehome demo``: a local swarm of separate processes trains a small language model."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from core.cli.common import (
    run_async,
)

demo_app = typer.Typer()


@demo_app.command()
def demo(
    volunteers: Annotated[
        int, typer.Option(min=1, max=32, help="Volunteer nodes, each its own process.")
    ] = 4,
    steps: Annotated[int, typer.Option(min=1, help="Training steps of the trainer.")] = 200,
    churn: Annotated[
        bool, typer.Option(help="Kill a third of the volunteers mid-run; as many new ones join.")
    ] = False,
    attackers: Annotated[
        int,
        typer.Option(
            min=0, max=32, help="Extra volunteers that poison their gradients or answers."
        ),
    ] = 0,
    attack: Annotated[
        str,
        typer.Option(
            help="What attackers send: poisoned gradients (sign-flip, alie, copied, drift) "
            "or wrong answers (scaled-answers, noised-answers, lazy-answers, stale-answers); "
            "several, comma-separated: the attackers take turns."
        ),
    ] = "sign-flip",
    slow: Annotated[
        int, typer.Option(min=0, max=32, help="Volunteers behind a slow link (of --volunteers).")
    ] = 0,
    slow_ms: Annotated[float, typer.Option(min=0, help="The slow link's delay per message.")] = 100,
    rule: Annotated[
        str, typer.Option(help="Aggregation rule: centered_clip, median, trimmed_mean, mean.")
    ] = "centered_clip",
    data: Annotated[
        str, typer.Option(help="Training text: 'stdlib' or a folder of text files.")
    ] = "stdlib",
    architecture: Annotated[
        str,
        typer.Option(
            help="The model: mixtral (transformers' Mixtral layers, SwiGLU experts) or byte "
            "(moehome's small byte model).",
        ),
    ] = "mixtral",
    vocab_size: Annotated[
        int,
        typer.Option(
            min=0,
            max=65536,
            help="mixtral: the BPE tokenizer's size, learned from the data first (0: bytes).",
        ),
    ] = 1024,
    workdir: Annotated[
        Path | None, typer.Option(help="Keep every process's files here (default: a temp folder).")
    ] = None,
    sample: Annotated[
        bool,
        typer.Option(
            "--sample/--no-sample",
            help="At the end, export the trained model and sample text from it.",
        ),
    ] = True,
    experts: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Experts each volunteer serves (default: all 16, so each expert has "
            "several servers). Fewer: the volunteers split them, and every one must be "
            "reached.",
        ),
    ] = None,
    nat: Annotated[
        bool,
        typer.Option(
            "--nat",
            help="Put the volunteers and the trainer behind NAT routers (Linux network "
            "namespaces; needs root): the summary says how each volunteer was reached.",
        ),
    ] = False,
    symmetric: Annotated[
        bool,
        typer.Option(
            "--symmetric",
            help="With --nat: the volunteers' second home has a symmetric NAT, where hole "
            "punching fails: its volunteers are reached through relays.",
        ),
    ] = False,
    kill_relay: Annotated[
        bool,
        typer.Option(
            "--kill-relay",
            help="With --nat: kill the bootstrap peer, a relay the volunteers use, halfway; "
            "they move to other relays.",
        ),
    ] = False,
    in_flight: Annotated[
        int,
        typer.Option(min=1, max=64, help="Batches the trainer carries through the swarm at once."),
    ] = 2,
    wire: Annotated[
        str,
        typer.Option(
            help="How activations/gradients travel: raw, f16, bf16, q8, q4, q3, q4z "
            "(one codec, or two as ACTIVATIONS/GRADIENTS, e.g. q4/q3)."
        ),
    ] = "q4z",
    relay_circuit_mib: Annotated[
        float | None,
        typer.Option(
            "--relay-circuit-mib",
            min=0.01,
            help="With --nat: bytes a relayed connection may carry one way (MiB).",
            hidden=True,
        ),
    ] = None,
    audit_rate: Annotated[
        float | None,
        typer.Option(
            "--audit-rate",
            min=0,
            max=1,
            help="The share of expert answers the trainer and of contributions the "
            "aggregator recompute (default: the manifest's 0.05).",
        ),
    ] = None,
    eval_every: Annotated[
        int, typer.Option(min=1, help="The trainer evaluates every this many steps.")
    ] = 100,
    trainer_optimizer: Annotated[
        str,
        typer.Option(
            help="The trainer-side layers' optimizer: adamw, or muon (hidden matrices; "
            "AdamW for the rest)."
        ),
    ] = "adamw",
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Train a small language model on a local swarm: a bootstrap peer, the owner
    publishing a project, an aggregator, volunteer nodes and a trainer, each its own
    process on 127.0.0.1. Live progress, then a summary. Ctrl-C stops everything."""
    from core.aggregator.robust import RULES
    from core.demo import DemoOptions, print_summary, run_demo, wire_codecs
    from core.demo.rig import KNOWN

    if any(a not in KNOWN for a in attack.split(",")):
        typer.echo(f"error: --attack must be one of {', '.join(KNOWN)}", err=True)
        raise typer.Exit(2)
    if slow > volunteers:
        typer.echo("error: --slow cannot exceed --volunteers", err=True)
        raise typer.Exit(2)
    if rule not in RULES:
        typer.echo(f"error: --rule must be one of {', '.join(RULES)}", err=True)
        raise typer.Exit(2)
    try:
        wire_codecs(wire)
    except ValueError as exc:
        typer.echo(f"error: --wire: {exc}", err=True)
        raise typer.Exit(2) from None
    if (symmetric or kill_relay) and not nat:
        typer.echo("error: --symmetric and --kill-relay go with --nat", err=True)
        raise typer.Exit(2)
    if nat:
        from net.testing.lab import missing_requirements

        why_not = missing_requirements()
        if why_not is not None:
            typer.echo(
                f"error: --nat runs the swarm in network namespaces behind NAT routers, "
                f"which needs root and the ip, nft and tc commands (Linux): {why_not}",
                err=True,
            )
            raise typer.Exit(2)
    options = DemoOptions(
        volunteers=volunteers,
        steps=steps,
        churn=churn,
        attackers=attackers,
        attack=attack,
        slow=slow,
        slow_ms=slow_ms,
        rule=rule,
        data=data,
        architecture=architecture,
        vocab_size=vocab_size,
        workdir=workdir,
        sample=sample,
        nat=nat,
        symmetric=symmetric,
        kill_relay=kill_relay,
        in_flight=in_flight,
        wire=wire,
        relay_circuit_mib=relay_circuit_mib,
        eval_every=eval_every,
        trainer_optimizer=trainer_optimizer,
    )
    if trainer_optimizer not in ("adamw", "muon"):
        typer.echo(f"error: --trainer-optimizer {trainer_optimizer}: adamw or muon", err=True)
        raise typer.Exit(2)
    if architecture not in ("mixtral", "byte"):
        typer.echo(f"error: --architecture {architecture}: mixtral or byte", err=True)
        raise typer.Exit(2)
    if 0 < vocab_size < 257:
        typer.echo("error: --vocab-size: 0 (bytes) or at least 257", err=True)
        raise typer.Exit(2)
    if experts is not None:
        options = replace(options, experts_per_volunteer=experts)
    if audit_rate is not None:
        options = replace(options, answer_audit_rate=audit_rate, contribution_audit_rate=audit_rate)
    summary = run_async(partial(run_demo, options, quiet=as_json))
    if as_json:
        typer.echo(json.dumps(summary))
    elif summary is not None:
        print_summary(summary)
