"""``moehome owner ...``: the project owner's keys, manifests, publishing, status and
training; ``moehome aggregator ...``: an aggregator of a project."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from core.cli.common import (
    BootstrapOpt,
    ListenOpt,
    PublicListenOpt,
    data_folder,
    load_identity,
    one_line_errors,
    run_async,
)
from core.control.invite import make_invite

owner_app = typer.Typer(
    help="For project owners: keys, manifests, publishing, status.", no_args_is_help=True
)
aggregator_app = typer.Typer(help="Run an aggregator of a project.", no_args_is_help=True)

PassphraseFileOpt = Annotated[
    Path | None,
    typer.Option(
        help=(
            "File holding the owner key's passphrase "
            "(else MOEHOME_OWNER_PASSPHRASE, else a prompt)."
        )
    ),
]


def _passphrase(file: Path | None, *, needed: bool = True, confirm: bool = False) -> str | None:
    import os

    if file is not None:
        return file.read_text().strip("\n")
    env = os.environ.get("MOEHOME_OWNER_PASSPHRASE")
    if env is not None:
        return env
    if needed and sys.stdin.isatty():
        return str(
            typer.prompt("owner key passphrase", hide_input=True, confirmation_prompt=confirm)
        )
    return None


def _owner_key(passphrase_file: Path | None) -> Any:
    from core.project.keys import OwnerKey, OwnerKeyError
    from core.project.owner import OwnerFiles

    files = OwnerFiles.default()
    try:
        data = files.key.read_bytes() if files.key.exists() else b""
        encrypted = b"ENCRYPTED" in data
        return OwnerKey.load(files.key, _passphrase(passphrase_file, needed=encrypted)), files
    except OwnerKeyError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


@owner_app.command("init")
def owner_init(
    protect: Annotated[
        bool,
        typer.Option("--passphrase/--no-passphrase", help="Encrypt the key with a passphrase."),
    ] = False,
    passphrase_file: PassphraseFileOpt = None,
    force: Annotated[bool, typer.Option(help="Replace an existing owner key.")] = False,
) -> None:
    """Create the owner's Ed25519 key and print its fingerprint."""
    from core.project.keys import OwnerKeyError
    from core.project.owner import OwnerFiles, init_owner

    files = OwnerFiles.default()
    secret = _passphrase(passphrase_file, needed=protect, confirm=True) if protect else None
    if protect and not secret:
        typer.echo(
            "error: --passphrase needs a passphrase (a file, the environment, or a terminal)",
            err=True,
        )
        raise typer.Exit(2)
    try:
        key = init_owner(files, secret, force=force)
    except OwnerKeyError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"owner key:   {files.key}{' (passphrase-protected)' if secret else ''}")
    typer.echo(f"fingerprint: {key.fingerprint}")
    typer.echo(f"public key:  {key.public_key.hex()}")


@owner_app.command("new")
def owner_new(
    path: Annotated[Path, typer.Argument(help="Where to write the manifest.")] = Path(
        "project.toml"
    ),
    name: Annotated[
        str, typer.Option(help="Project name (lowercase, digits, '-').")
    ] = "my-project",
    from_folder: Annotated[
        Path | None,
        typer.Option(
            "--from",
            help=(
                "A Hugging Face Mixtral folder (config.json, safetensors, tokenizer.json): "
                "the project starts from its weights (continued pre-training)."
            ),
        ),
    ] = None,
    tokenizer_file: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer",
            help="A tokenizer.json (see owner tokenizer): pinned, vocab_size its vocabulary.",
        ),
    ] = None,
) -> None:
    """Write a commented project manifest to edit before publishing. This computer's
    aggregator and trainer are listed in it (each role has its own key). With --from,
    the model is the checkpoint's: its weights go to a folder beside the manifest."""
    from core.project.template import write_template

    aggregator = load_identity(False, role="aggregator").public_key.hex()
    trainer = load_identity(False, role="trainer").public_key.hex()
    if from_folder is not None:
        _owner_new_from(from_folder, path, name, aggregator, trainer)
        return
    pinned = None
    if tokenizer_file is not None:
        with one_line_errors(OSError):
            from core.data.tokenizer import HFTokenizer

            loaded = HFTokenizer.load(tokenizer_file)
            pinned = (loaded.sha256, loaded.vocab_size)
            beside = path.parent / "tokenizer.json"  # where owner publish takes it from
            if not beside.exists():
                import shutil

                beside.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(tokenizer_file, beside)
            elif HFTokenizer.load(beside).sha256 != loaded.sha256:
                typer.echo(f"error: {beside} is another tokenizer; move it away first", err=True)
                raise typer.Exit(2)
    try:
        write_template(path, name, aggregator_key=aggregator, trainer_key=trainer, tokenizer=pinned)
    except (FileExistsError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(
        f"wrote {path}, with this computer's aggregator and trainer; edit it, then: "
        f"moehome owner publish {path}"
    )


def _owner_new_from(folder: Path, path: Path, name: str, aggregator: str, trainer: str) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with one_line_errors(OSError, ValueError):
        from core.families.start import start_from_pretrained

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
        with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("experts written", total=None)
            started = start_from_pretrained(
                folder,
                path,
                name,
                aggregator_key=aggregator,
                trainer_key=trainer,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
    said = "bytes" if started.tokenizer == "bytes" else f"tokenizer.json {started.tokenizer[:12]}"
    typer.echo(
        f"wrote {path} ({started.experts} experts and the trainer's layers of {folder} in "
        f"{started.weights}, {said}), with this computer's aggregator and trainer; "
        f"edit it, then: moehome owner publish {path}"
    )


@owner_app.command("publish")
def owner_publish(
    manifest: Annotated[Path, typer.Argument(help="The project manifest (TOML).")],
    workdir: Annotated[
        Path | None,
        typer.Option(help="Where weights and chunks go (default: beside the manifest)."),
    ] = None,
    listen: PublicListenOpt = None,
    bootstrap: BootstrapOpt = None,
    passphrase_file: PassphraseFileOpt = None,
    serve: Annotated[
        bool, typer.Option("--serve/--no-serve", help="Stay up serving the weights.")
    ] = True,
) -> None:
    """Check and sign the manifest, make the weights, announce the project, serve it."""
    from rich.progress import Progress

    from core.project.manifest import ManifestError
    from core.project.publish import prepare
    from core.trainer.initial import trunk_shapes_of

    key, files = _owner_key(passphrase_file)
    workdir = workdir or manifest.parent / f"{manifest.stem}.moehome"
    try:
        with Progress(transient=True) as progress:
            task = progress.add_task("making weights", total=None)
            prepared = prepare(
                manifest,
                key,
                files.load_rotations(),
                workdir,
                lambda done, total: progress.update(task, completed=done, total=total),
                trunk_shapes=trunk_shapes_of,
            )
    except ManifestError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    signed = prepared.signed
    typer.echo(f"project id:  {signed.project_id}")
    typer.echo(f"owner:       {key.fingerprint}")
    from core.project.chunks import TOKENIZER_ENTRY
    from core.protocol.contributions import TRUNK_UID

    published = prepared.index.files
    experts = len(set(published) - {TRUNK_UID, TOKENIZER_ENTRY})
    trunk = " and the trainer's layers" if TRUNK_UID in published else ""
    tokenizer = " and the tokenizer" if TOKENIZER_ENTRY in published else ""
    typer.echo(
        f"experts:     {experts}{trunk}{tokenizer} "
        f"({len(list(prepared.store.root.glob('??/*')))} chunks)"
    )
    if not serve:
        return
    from core.roles.owner import publish_and_serve

    run_async(
        partial(
            publish_and_serve,
            load_identity(False, role="owner"),
            prepared,
            listen=listen,
            bootstrap=bootstrap or [],
        )
    )


@owner_app.command("status")
def owner_status(
    project_id: Annotated[str, typer.Argument(help="The project id printed by publish.")],
    bootstrap: BootstrapOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """What the swarm looks like for a project."""
    from core.roles.owner_status import status_once

    status = run_async(
        partial(status_once, load_identity(True), project_id, bootstrap or [], data_folder())
    )
    if as_json:
        from core.project.owner import to_json

        typer.echo(to_json(status))
        return
    typer.echo(f"{status['name']} ({status['project_id']}), owner {status['owner']}")
    typer.echo(f"invite: {make_invite(status['project_id'], bootstrap or []).link()}")
    typer.echo(
        f"experts covered: {status['experts_covered']}/{status['experts_total']}, "
        f"volunteers: {len(status['volunteers'])} serving"
        + (
            f", {len(status['paused_volunteers'])} paused (or leaving)"
            if status["paused_volunteers"]
            else ""
        )
    )
    versions: dict[str, int] = {}
    for agg in status["aggregators"]:
        versions.update(agg.get("versions", {}))
    for uid, servers in status["experts"].items():
        version = f", version {versions[uid]}" if uid in versions else ""
        typer.echo(f"  {uid:<16} {len(servers)} server(s){version}")
    typer.echo(
        f"weight providers: {len(status['weight_providers'])}, "
        f"aggregators: {len(status['aggregators'])}"
    )
    for agg in status["aggregators"]:
        if "unreachable" in agg:
            typer.echo(f"  aggregator {agg['peer'][-12:]}: unreachable ({agg['unreachable']})")
            continue
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(agg["rejected"].items())) or "none"
        held = list(agg["versions"].values())
        span = f"{min(held)}-{max(held)}" if held else "none"
        late = (
            f"; contributions applied {agg['mean_versions_late']:.2f} versions late, "
            f"{agg['mean_age_s']:.0f} s after they were signed"
            if agg.get("mean_versions_late") is not None
            else ""
        )
        typer.echo(
            f"  aggregator {agg['peer'][-12:]}: {agg['accepted']} accepted, rejected: {rejected}; "
            f"{len(held)} experts at versions {span}{late}"
        )
    if status["experts_waiting"]:
        typer.echo(f"experts not learning: {status['experts_waiting']}")


@owner_app.command("page")
def owner_page(
    project_id: Annotated[str, typer.Argument(help="The project id printed by publish.")],
    bootstrap: BootstrapOpt = None,
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="The folder the page goes to (index.html, page.json)."),
    ] = Path("project-page"),
    serve: Annotated[
        str | None,
        typer.Option(
            help="Also serve the folder over HTTP at HOST:PORT (127.0.0.1:8080; port 0 picks "
            "one; 0.0.0.0:8080 for everyone), refreshing the page until stopped."
        ),
    ] = None,
    every: Annotated[
        float | None,
        typer.Option(
            min=5,
            help="Write the page again every this many seconds until stopped "
            "(serving: 60 by default; else the page is written once).",
        ),
    ] = None,
) -> None:
    """The project's public page: validation loss over time, experts and who serves them,
    throughput, the credit leaderboard, bans and their reasons, the invite. It shows
    only what keys of the signed manifest signed; the folder is static files for any web
    host."""
    from core.page.serve import run_page

    def ready(page: Path, url: str | None) -> None:
        typer.echo(f"page: {page.resolve()}")
        if url is not None:
            typer.echo(f"served at: {url} (refreshed every {every or 60:g} s; Ctrl-C stops)")
        sys.stdout.flush()

    run_async(
        partial(
            run_page,
            load_identity(True),
            project_id,
            bootstrap or [],
            data_folder(),
            out,
            every=every,
            bind=serve,
            on_ready=ready,
        )
    )


@owner_app.command("rotate-key")
def owner_rotate_key(
    bootstrap: BootstrapOpt = None,
    passphrase_file: PassphraseFileOpt = None,
    new_passphrase_file: Annotated[
        Path | None, typer.Option(help="Passphrase for the new key.")
    ] = None,
) -> None:
    """Replace the owner key; the old key signs the hand-over (announced if -b is given).
    Publish again afterwards: volunteers follow the rotation."""
    from core.project.keys import OwnerKeyError
    from core.project.owner import OwnerFiles, rotate_owner

    files = OwnerFiles.default()
    try:
        data = files.key.read_bytes() if files.key.exists() else b""
        old_secret = _passphrase(passphrase_file, needed=b"ENCRYPTED" in data)
        new_secret = (
            new_passphrase_file.read_text().strip("\n") if new_passphrase_file else old_secret
        )
        rotation = rotate_owner(files, old_secret, new_secret)
    except OwnerKeyError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    from core.project.keys import fingerprint

    typer.echo(f"owner key rotated: {fingerprint(rotation.old)} -> {fingerprint(rotation.new)}")
    if bootstrap:
        from core.roles.owner_status import announce_rotation_once

        replicas = run_async(
            partial(announce_rotation_once, load_identity(True), rotation, bootstrap)
        )
        typer.echo(f"rotation announced on {replicas} peers")


@owner_app.command("train")
def owner_train(
    project_id: Annotated[str, typer.Option("--project", help="The project id.")],
    data: Annotated[
        list[str] | None,
        typer.Option(
            help=(
                "Training data: 'stdlib' (Python's own sources, the default), a folder of "
                "text files, .jsonl, .parquet, a saved dataset, or token shards (owner "
                "prepare); repeated, PATH@WEIGHT makes a weighted mixture (mixtral projects)."
            )
        ),
    ] = None,
    tokenizer_file: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer",
            help="The project's tokenizer.json, when the data are text (shards keep theirs).",
        ),
    ] = None,
    steps: Annotated[int, typer.Option(min=1, help="Train until this step.")] = 1000,
    batch_size: Annotated[int, typer.Option(min=1, max=4096, help="Sequences per step.")] = 16,
    learning_rate: Annotated[
        float, typer.Option("--lr", min=0, help="Adam's rate for the trainer-side layers.")
    ] = 3e-3,
    eval_every: Annotated[int, typer.Option(min=1, help="Validation every N steps.")] = 100,
    checkpoint_every: Annotated[int, typer.Option(min=1, help="Checkpoint every N steps.")] = 50,
    log_every: Annotated[int, typer.Option(min=1, help="Progress every N steps.")] = 10,
    max_data_mb: Annotated[float, typer.Option(min=0.01, help="Read at most this much text.")] = 32,
    workdir: Annotated[
        Path | None,
        typer.Option(help="Checkpoints (default: <data dir>/trainer/<project>); reused to resume."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    device: Annotated[
        str, typer.Option(help="Trainer-side layers on: auto (a GPU if any), cpu, cuda[:N].")
    ] = "auto",
    in_flight: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            help="Batches carried through the swarm at once (their round trips overlap).",
        ),
    ] = 1,
    final_round_wait: Annotated[
        float,
        typer.Option(
            min=0,
            help="Before the final evaluation, wait up to this many seconds for the "
            "experts' round after the last step (0: evaluate at once).",
        ),
    ] = 0.0,
    ramp_in_flight: Annotated[
        bool,
        typer.Option(
            help="Start with one batch in flight and carry more, up to --in-flight, as the "
            "gradient noise scale grows (one fewer when it falls well below).",
        ),
    ] = False,
    listen: ListenOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Train the project's model through the swarm: the trainer-side layers here, the
    experts on volunteers' machines. This computer's trainer key (`moehome owner
    trainer-key`; `owner new` lists it) must be in the manifest's \\[\\[trainers]].
    Resumes from its checkpoint after a restart."""
    from core.trainer.progress import TrainingProgress, json_line
    from core.trainer.train import TrainerOptions, run_trainer

    data_dir = data_folder()
    options = TrainerOptions(
        project=project_id,
        workdir=workdir or data_dir / "trainer" / project_id,
        data=tuple(data or ["stdlib"]),
        tokenizer=tokenizer_file,
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        log_every=log_every,
        eval_every=eval_every,
        checkpoint_every=checkpoint_every,
        max_data_bytes=int(max_data_mb * 1024 * 1024),
        device=device,
        in_flight=in_flight,
        final_round_wait_s=final_round_wait,
        ramp_in_flight=ramp_in_flight,
    )
    run = partial(
        run_trainer,
        load_identity(False, role="trainer"),
        options,
        data_dir=data_dir,
        listen=listen,
        bootstrap=bootstrap or [],
    )
    if as_json:
        run_async(partial(run, report=json_line))
        return
    with TrainingProgress() as progress:
        run_async(partial(run, report=progress))


DataArg = Annotated[
    Path,
    typer.Argument(
        help=(
            "The data: a text file or folder, .jsonl(.gz) or .parquet files (or a folder of "
            "them), or a folder saved with datasets' save_to_disk."
        )
    ),
]
FormatOpt = Annotated[
    str | None,
    typer.Option(
        "--format",
        help="text, jsonl, parquet or dataset (default: guessed from the path).",
        show_default=False,
    ),
]
FieldOpt = Annotated[str, typer.Option(help="The JSON field, or the column, that holds the text.")]


@owner_app.command("tokenizer")
def owner_tokenizer(
    data: DataArg,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Where to write the tokenizer.json.")
    ],
    vocab_size: Annotated[
        int, typer.Option(min=257, help="Tokens at most: 256 bytes, the end-of-text token, merges.")
    ] = 4096,
    fmt: FormatOpt = None,
    field: FieldOpt = "text",
    max_mb: Annotated[
        float | None,
        typer.Option(min=0.001, help="Learn from the first N MB of text only (default: all)."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing output file.")] = False,
) -> None:
    """Train a byte-level BPE tokenizer on your data, offline; print its sha256 (what a
    manifest pins)."""
    with one_line_errors(OSError):
        from core.data.documents import open_documents
        from core.data.tokenizer import train_bpe

        if output.exists() and not force:
            typer.echo(f"error: {output} exists; choose another --output, or --force", err=True)
            raise typer.Exit(2)
        source = open_documents(data, fmt, field)
        budget = None if max_mb is None else int(max_mb * 1024 * 1024)

        def texts() -> Iterator[str]:
            taken = 0
            for document in source:
                if budget is not None and taken >= budget:
                    return
                taken += len(document.text.encode("utf-8"))
                yield document.text

        from rich.console import Console

        with Console(stderr=True).status(f"learning {vocab_size} tokens from {source.describe()}"):
            tokenizer = train_bpe(texts(), vocab_size, output)
    typer.echo(f"tokenizer:  {output}")
    typer.echo(f"vocab size: {tokenizer.vocab_size} (end of text: {tokenizer.eos_id})")
    typer.echo(f"sha256:     {tokenizer.sha256}")


@owner_app.command("prepare")
def owner_prepare(
    data: DataArg,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="The shards' folder (new, or empty).")
    ],
    tokenizer_file: Annotated[
        Path | None,
        typer.Option("--tokenizer", help="A Hugging Face tokenizer.json (see owner tokenizer)."),
    ] = None,
    as_bytes: Annotated[
        bool, typer.Option("--bytes", help="One token per byte instead of a tokenizer.")
    ] = False,
    fmt: FormatOpt = None,
    field: FieldOpt = "text",
) -> None:
    """Tokenize your data once into token shards that the trainers read."""
    if (tokenizer_file is None) == (not as_bytes):
        typer.echo("error: give either --tokenizer FILE or --bytes", err=True)
        raise typer.Exit(2)
    with one_line_errors(OSError):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        from core.data.documents import open_documents
        from core.data.prepare import prepare
        from core.data.tokenizer import ByteTokenizer, HFTokenizer, TextTokenizer

        tokenizer: TextTokenizer = (
            ByteTokenizer() if tokenizer_file is None else HFTokenizer.load(tokenizer_file)
        )
        source = open_documents(data, fmt, field)
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),  # bytes of text
            TransferSpeedColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task("tokenizing", total=source.total_bytes)
            index = prepare(
                source,
                tokenizer,
                output,
                on_progress=lambda done: progress.update(task, completed=done),
            )
    if tokenizer_file is not None:  # beside the shards: trainers and export find it there
        import shutil

        shutil.copyfile(tokenizer_file, output / "tokenizer.json")
    typer.echo(
        f"{index.documents:,} documents, {index.tokens:,} tokens in {len(index.shards)} "
        f"shard(s): {output}"
    )
    typer.echo(f"tokenizer: {index.tokenizer} (vocab size {index.vocab_size})")


@aggregator_app.command("key")
def aggregator_key() -> None:
    """Print the public key of this computer's aggregator, for a manifest's
    \\[\\[aggregators]] (`moehome owner new` fills in this computer's own)."""
    identity = load_identity(ephemeral=False, role="aggregator")
    typer.echo(identity.public_key.hex())


@owner_app.command("trainer-key")
def trainer_key() -> None:
    """Print the public key of this computer's trainer, for a manifest's \\[\\[trainers]]
    (`moehome owner new` fills in this computer's own)."""
    identity = load_identity(ephemeral=False, role="trainer")
    typer.echo(identity.public_key.hex())


@aggregator_app.command("run")
def aggregator_run(
    project_id: Annotated[str, typer.Option("--project", help="The project id.")],
    workdir: Annotated[
        Path | None, typer.Option(help="State folder (default: <data dir>/aggregator/<project>).")
    ] = None,
    listen: PublicListenOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Verify and robustly aggregate contributions for this computer's share of the
    project's experts; publish new versions. State survives kill -9 (restart resumes)."""
    from core.roles.aggregator import run_aggregator

    data = data_folder()
    run_async(
        partial(
            run_aggregator,
            load_identity(False, role="aggregator"),
            project_id,
            workdir=workdir or data / "aggregator" / project_id,
            data_dir=data,
            listen=listen,
            bootstrap=bootstrap or [],
        )
    )
