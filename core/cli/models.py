"""``moehome owner export | generate | eval``: the project's model taken out (a folder
``transformers`` loads), sampled and measured. Registered on ``owner`` by main.py."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from core.cli.common import BootstrapOpt, data_folder, load_identity, one_line_errors, run_async

ModelArg = Annotated[
    Path, typer.Argument(help="A folder written by `moehome owner export` (or any Mixtral).")
]


def register_model_commands(owner_app: typer.Typer) -> None:
    owner_app.command("export")(owner_export)
    owner_app.command("generate")(owner_generate)
    owner_app.command("eval")(owner_eval)


def owner_export(
    project_id: Annotated[str, typer.Option("--project", help="The project id.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="A new (or empty) folder.")],
    workdir: Annotated[
        Path | None,
        typer.Option(help="The trainer's folder (default: <data dir>/trainer/<project>)."),
    ] = None,
    tokenizer_file: Annotated[
        Path | None,
        typer.Option("--tokenizer", help="The project's tokenizer.json (default: the trainer's)."),
    ] = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Write the project's model as a Hugging Face folder (config, safetensors, tokenizer):
    the trainer's layers from its newest checkpoint, every expert at the newest version
    the aggregators announce. `transformers.AutoModelForCausalLM.from_pretrained` loads it."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from core.roles.export import export_once

    data_dir = data_folder()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("experts fetched", total=None)
        exported = run_async(
            partial(
                export_once,
                load_identity(True, role="trainer"),
                project_id,
                bootstrap or [],
                data_dir,
                output,
                workdir=workdir or data_dir / "trainer" / project_id,
                tokenizer=tokenizer_file,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
        )
    versions = list(exported.versions.values())
    step = exported.trainer_step
    typer.echo(f"exported: {exported.folder}")
    typer.echo(
        "trainer layers: "
        + ("initial (no checkpoint of the trainer)" if step is None else f"step {step}")
    )
    typer.echo(f"experts: {len(versions)} at versions {min(versions)}-{max(versions)}")


def owner_generate(
    model: ModelArg,
    prompts: Annotated[
        list[str] | None, typer.Option("--prompt", help="The text to continue (repeated: each).")
    ] = None,
    tokens: Annotated[int, typer.Option(min=1, max=100_000, help="New tokens at most.")] = 100,
    temperature: Annotated[float, typer.Option(min=0, help="0: greedy.")] = 0.8,
    samples: Annotated[int, typer.Option(min=1, max=100, help="How many continuations.")] = 1,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
) -> None:
    """Sample text from an exported model."""
    with one_line_errors(OSError, ValueError):
        from core.families.use import generate_text, load_exported

        loaded, tokenizer = load_exported(model)
        runs = [(p, i) for p in prompts or [""] for i in range(samples)]
        for n, (prompt, i) in enumerate(runs):
            text = generate_text(
                loaded,
                tokenizer,
                prompt,
                max_new_tokens=tokens,
                temperature=temperature,
                seed=seed + i,
            )
            typer.echo(prompt + text)
            if n + 1 < len(runs):
                typer.echo("-" * 40)


def owner_eval(
    model: ModelArg,
    data: Annotated[
        list[Path], typer.Option(help="Token shards (owner prepare) whose held-out ends to use.")
    ],
    batches: Annotated[int, typer.Option(min=1, help="Held-out batches of 8 windows.")] = 8,
    context: Annotated[
        int | None, typer.Option(help="Tokens per window (default: the model's context).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Loss and bits per byte of an exported model on the held-out ends of token shards
    (the windows no trainer trains on)."""
    with one_line_errors(OSError, ValueError):
        import json

        from core.data.loader import PackedLoader, SourceSpec
        from core.families.use import evaluate, load_exported

        loaded, tokenizer = load_exported(model)
        loader = PackedLoader(
            [SourceSpec(path) for path in data],
            context=context or int(loaded.config.max_position_embeddings),
            batch_size=8,
            vocab_size=int(loaded.config.vocab_size),
            tokenizer=tokenizer.sha256,
        )
        try:
            result = evaluate(loaded, tokenizer, loader.validation_batches(batches))
        finally:
            loader.close()
    if as_json:
        typer.echo(json.dumps(result.__dict__))
        return
    typer.echo(
        f"loss {result.loss:.4f} nats/token, {result.bits_per_byte:.4f} bits/byte "
        f"({result.tokens:,} tokens, {result.bytes:,} bytes held out)"
    )
