"""``moehome credit``: what this computer's node earned in a project, signed by the
project's aggregators, written as a proof anyone can check with ``moehome credit
verify`` (core/project/credit_proof.py)."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from core.cli.common import (
    BootstrapOpt,
    data_folder,
    load_identity,
    one_line_errors,
    run_async,
    settings,
)

if TYPE_CHECKING:  # the commands import it when they run (libp2p comes with it)
    from core.project.credit_proof import VerifiedCredit

credit_app = typer.Typer(help="Credit: verified work, signed by a project's aggregators.")

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _day(day: int) -> str:
    if day < 0:
        return "earlier"
    return time.strftime("%Y-%m-%d", time.gmtime(day * 86_400))


def _read(file: Path) -> bytes:
    """A proof file's bytes, or a one-line error (exit 2)."""
    try:
        return file.read_bytes()
    except OSError as exc:
        typer.echo(f"error: cannot read {file}: {exc.strerror}", err=True)
        raise typer.Exit(2) from exc


def _print(verified: VerifiedCredit, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(verified.to_obj(), indent=2))
        return
    typer.echo(f"project {verified.project_name} ({verified.project_id})")
    typer.echo(f"contributor {verified.contributor.hex()}")
    typer.echo(
        f"credit: {verified.total:,.1f} from {len(verified.statements)} aggregator(s)"
        + (f", {verified.revoked:,.1f} taken back by bans" if verified.revoked else "")
    )
    for day, credit in verified.per_day().items():
        typer.echo(f"  {_day(day)}  {credit:,.1f}")


@credit_app.callback(invoke_without_command=True)
def credit(
    ctx: typer.Context,
    project: Annotated[
        str | None, typer.Option(help="The project id (an invite's or `moehome join`'s).")
    ] = None,
    proof: Annotated[
        Path | None, typer.Option(help="Write the proof here (default: credit-<project>.proof).")
    ] = None,
    bootstrap: BootstrapOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """This computer's credit in a project, as its aggregators sign it; writes a proof."""
    if ctx.invoked_subcommand is not None:
        return
    if project is None:
        typer.echo("error: name the project: moehome credit --project ID", err=True)
        raise typer.Exit(2)
    from core.node.credit import link_for
    from core.paths import identity_path
    from core.project.credit_proof import proof_bytes, verify_proof
    from core.roles.credit import collect_credit
    from net.identity import IdentityError, load

    path = identity_path(settings.data_dir, "node")
    try:
        contributor = load(path).public_key
    except (FileNotFoundError, IdentityError) as exc:
        typer.echo(f"error: no node key at {path} ({exc}): run the node first", err=True)
        raise typer.Exit(2) from exc
    signed, statements, missing = run_async(
        partial(collect_credit, contributor, project, bootstrap or [], data_folder())
    )
    for key, why in missing.items():
        typer.echo(f"aggregator {key[:16]} gave no statement: {why}", err=True)
    data = proof_bytes(signed, contributor, statements, link_for(data_folder(), contributor))
    with one_line_errors():
        verified = verify_proof(data)
    target = proof or Path(f"credit-{project[:16]}.proof")
    target.write_bytes(data)
    _print(verified, as_json)
    if not as_json:
        typer.echo(f"proof: {target} (check it anywhere: moehome credit verify {target})")


@credit_app.command("verify")
def credit_verify(
    file: Annotated[Path, typer.Argument(help="A proof written by `moehome credit` or merge.")],
    project: Annotated[
        str | None,
        typer.Option(help="Fail unless the proof is of this project id (a proof is of its own)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a credit proof with nothing but the file (the owner's and aggregators' keys)."""
    from core.project.credit_proof import AccountCredit, verify_any

    data = _read(file)
    with one_line_errors():
        verified = verify_any(data)
    proofs = verified.proofs if isinstance(verified, AccountCredit) else [verified]
    if project is not None and any(p.project_id != project for p in proofs):
        others = sorted({p.project_id for p in proofs} - {project})
        typer.echo(f"error: the proof is of project {', '.join(others)}, not {project}", err=True)
        raise typer.Exit(1)
    if isinstance(verified, AccountCredit):
        if as_json:
            typer.echo(json.dumps(verified.to_obj(), indent=2))
            return
        typer.echo(
            f"account {verified.account.hex()}: credit {verified.total:,.1f} from "
            f"{len({p.contributor for p in proofs})} computer(s)"
        )
        for proof in proofs:
            typer.echo(
                f"  {proof.project_name} ({proof.project_id[:16]}), computer "
                f"{proof.contributor.hex()[:16]}: {proof.total:,.1f}"
            )
        typer.echo("verified: signed by the projects' owners, aggregators and the computers")
        return
    _print(verified, as_json)
    if not as_json:
        typer.echo("verified: signed by the project's owner and its aggregators")


@credit_app.command("link")
def credit_link(
    account: Annotated[
        str | None,
        typer.Argument(
            help="The account key (hex) another computer printed; default: this computer's."
        ),
    ] = None,
) -> None:
    """Count this computer's credit for an account, so several computers add up."""
    from core.node.credit import save_link
    from core.protocol.credit import AccountLink

    if account is None:
        key = load_identity(False, "account").public_key
    else:
        try:
            key = bytes.fromhex(account)
        except ValueError:
            key = b""
        if len(key) != 32:
            typer.echo("error: an account key is 64 hex characters", err=True)
            raise typer.Exit(2)
    node = load_identity(False)
    path = save_link(data_folder(), AccountLink.sign(node, key, time.time()))
    typer.echo(f"this computer's credit counts for account {key.hex()} ({path})")
    if account is None:
        typer.echo(f"on your other computers: moehome credit link {key.hex()}")


@credit_app.command("merge")
def credit_merge(
    files: Annotated[list[Path], typer.Argument(help="Proofs of computers linked to one account.")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Where to write the account's proof.")],
) -> None:
    """Gather the proofs of one account's computers (and projects) into one."""
    from core.project.credit_proof import account_proof_bytes, verify_account_proof, verify_proof

    proofs = [_read(f) for f in files]
    with one_line_errors():
        accounts = {verify_proof(p).account for p in proofs}
        if None in accounts or len(accounts) != 1:
            typer.echo(
                "error: every proof must come from a computer linked to the same account "
                "(moehome credit link), and be made after the link",
                err=True,
            )
            raise typer.Exit(1)
        account = next(iter(accounts))
        assert account is not None
        data = account_proof_bytes(account, proofs)
        verified = verify_account_proof(data)
    out.write_bytes(data)
    typer.echo(f"account {account.hex()}: {verified.total:,.1f} in all; proof: {out}")
