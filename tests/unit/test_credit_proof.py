"""Credit statements and proofs (core/protocol/credit.py, core/project/credit_proof.py):
a proof verifies with the file alone, and a forged or altered one fails with a reason."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.project.credit_proof import (
    ProofError,
    account_proof_bytes,
    proof_bytes,
    verify_account_proof,
    verify_any,
    verify_proof,
)
from core.project.keys import OwnerKey
from core.project.manifest import parse_manifest
from core.project.signed import SignedManifest
from core.protocol.credit import AccountLink, CreditStatement
from core.protocol.fields import MessageError
from net import Identity
from net.codec import pack, unpack_bounded

AGGREGATORS = [Identity.from_seed(bytes([100 + i]) * 32) for i in range(2)]
VOLUNTEER = Identity.from_seed(b"v" * 32)


def signed_manifest(aggregators: list[Identity] = AGGREGATORS) -> SignedManifest:
    m = parse_manifest(
        {
            "project": {"name": "credit"},
            "model": {
                "hidden": 32,
                "context": 16,
                "mixture_layers": 1,
                "grid": [2, 2],
                "k_best": 2,
                "expert": {"kind": "ffn", "hidden": 32, "inner": 64},
            },
            "aggregators": [{"key": a.public_key.hex()} for a in aggregators],
        }
    )
    return SignedManifest.create(m, OwnerKey.generate(), (), "0" * 64)


SIGNED = signed_manifest()


def statement(
    aggregator: Identity = AGGREGATORS[0],
    days: dict[int, float] | None = None,
    contributor: bytes = VOLUNTEER.public_key,
    project: str | None = None,
) -> CreditStatement:
    return CreditStatement.sign(
        aggregator,
        project or SIGNED.project_id,
        contributor,
        days if days is not None else {20_000: 12.0, 20_001: 3.5},
        revoked=0.0,
        issued=1.8e9,
    )


def test_a_statement_round_trips_and_verifies():
    s = statement(days={-1: 100.0, 20_000: 12.0})
    again = CreditStatement.decode(s.encode())
    assert again == s
    assert again.verify()
    assert again.total == 112.0


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda o: o[:6], "7 fields"),
        (lambda o: [*o[:2], [[2, 1.0], [1, 1.0]], *o[3:]], "increase"),
        (lambda o: [*o[:2], [[1, -1.0]], *o[3:]], ">= 0"),
        (lambda o: [*o[:2], [[1, float("nan")]], *o[3:]], "finite"),
        (lambda o: [*o[:2], [[1, 1.0]] * 2000, *o[3:]], "at most"),
        (lambda o: [o[0], b"short", *o[2:]], "contributor"),
    ],
)
def test_a_malformed_statement_is_refused_by_name(change, error):
    obj = unpack_bounded(statement().encode(), 1 << 20)
    with pytest.raises(MessageError, match=error):
        CreditStatement.decode(pack(change(obj)))


def test_garbage_is_not_a_statement():
    with pytest.raises(MessageError):
        CreditStatement.decode(b"\xc1garbage")
    with pytest.raises(MessageError, match="at most"):
        CreditStatement.decode(b"\x00" * (1 << 17))


def test_a_proof_verifies_from_the_file_alone_and_adds_the_aggregators_up():
    both = [statement(AGGREGATORS[0]), statement(AGGREGATORS[1], {20_001: 4.0})]
    verified = verify_proof(proof_bytes(SIGNED, VOLUNTEER.public_key, both))
    assert verified.project_id == SIGNED.project_id
    assert verified.project_name == "credit"
    assert verified.total == 12.0 + 3.5 + 4.0
    assert verified.per_day() == {20_000: 12.0, 20_001: 7.5}
    assert verified.to_obj()["contributor"] == VOLUNTEER.public_key.hex()


def _altered(s: CreditStatement) -> CreditStatement:
    """The same signature over more credit than was signed."""
    return replace(s, days=((20_000, 1e9),))


OUTSIDER = Identity.from_seed(b"o" * 32)


@pytest.mark.parametrize(
    ("statements", "contributor", "error"),
    [
        ([_altered(statement())], VOLUNTEER.public_key, "does not verify"),
        ([statement(OUTSIDER)], VOLUNTEER.public_key, "not an aggregator"),
        ([statement(contributor=OUTSIDER.public_key)], VOLUNTEER.public_key, "another contributor"),
        ([statement(project="f" * 32)], VOLUNTEER.public_key, "another project"),
        ([statement(), statement()], VOLUNTEER.public_key, "two statements"),
    ],
)
def test_a_forged_or_altered_proof_fails_with_its_reason(statements, contributor, error):
    with pytest.raises(ProofError, match=error):
        verify_proof(proof_bytes(SIGNED, contributor, statements))


def test_a_proof_under_another_manifest_or_no_proof_at_all_fails():
    # an outsider's own manifest naming itself an aggregator: another project id
    theirs = signed_manifest([OUTSIDER])
    with pytest.raises(ProofError, match="another project"):
        verify_proof(proof_bytes(theirs, VOLUNTEER.public_key, [statement(OUTSIDER)]))
    # a manifest whose signature is broken
    broken = replace(SIGNED, serial=SIGNED.serial + 1)
    with pytest.raises(ProofError, match="does not verify"):
        verify_proof(proof_bytes(broken, VOLUNTEER.public_key, [statement()]))
    for junk in (b"", b"\xc1", pack({"format": "something else"}), pack([1, 2])):
        with pytest.raises(ProofError, match="not a credit proof"):
            verify_proof(junk)


def test_credit_verify_says_what_a_proof_proves_and_fails_a_forged_one(tmp_path):
    from typer.testing import CliRunner

    from core.cli import app

    runner = CliRunner()
    good = tmp_path / "good.proof"
    good.write_bytes(proof_bytes(SIGNED, VOLUNTEER.public_key, [statement()]))
    result = runner.invoke(app, ["credit", "verify", str(good)])
    assert result.exit_code == 0, result.output
    assert "credit: 15.5 from 1 aggregator(s)" in result.output
    assert "verified" in result.output
    result = runner.invoke(app, ["credit", "verify", str(good), "--json"])
    assert result.exit_code == 0
    assert '"total": 15.5' in result.output
    # a proof of another project than the one asked about
    result = runner.invoke(app, ["credit", "verify", str(good), "--project", "f" * 32])
    assert result.exit_code == 1
    assert f"is of project {SIGNED.project_id}" in result.output
    forged = tmp_path / "forged.proof"
    forged.write_bytes(proof_bytes(SIGNED, VOLUNTEER.public_key, [_altered(statement())]))
    result = runner.invoke(app, ["credit", "verify", str(forged)])
    assert result.exit_code == 1
    assert "error: statement 0's signature does not verify" in result.output
    result = runner.invoke(app, ["credit", "verify", str(tmp_path / "missing.proof")])
    assert result.exit_code == 2
    assert "cannot read" in result.output


# ---------------------------------------------------------------- accounts

ACCOUNT = Identity.from_seed(b"a" * 32)
SECOND = Identity.from_seed(b"w" * 32)  # the volunteer's other computer


def node_proof(node: Identity, account: bytes | None, signed: SignedManifest = SIGNED) -> bytes:
    link = None if account is None else AccountLink.sign(node, account, 1.8e9)
    s = CreditStatement.sign(
        AGGREGATORS[0], signed.project_id, node.public_key, {20_000: 5.0}, 0.0, 1.8e9
    )
    return proof_bytes(signed, node.public_key, [s], link)


def test_an_account_link_round_trips_and_only_the_node_signs_it():
    link = AccountLink.sign(VOLUNTEER, ACCOUNT.public_key, 1.8e9)
    assert AccountLink.decode(link.encode()) == link
    assert link.verify()
    assert not replace(link, account=SECOND.public_key).verify()
    with pytest.raises(MessageError):
        AccountLink.decode(b"\x93\x01\x02\x03")


def test_two_computers_add_up_under_one_account():
    both = [node_proof(VOLUNTEER, ACCOUNT.public_key), node_proof(SECOND, ACCOUNT.public_key)]
    assert verify_proof(both[0]).account == ACCOUNT.public_key
    verified = verify_account_proof(account_proof_bytes(ACCOUNT.public_key, both))
    assert verified.total == 10.0
    assert verified.per_project() == {SIGNED.project_id: 10.0}
    assert verify_any(account_proof_bytes(ACCOUNT.public_key, both)) == verified
    assert verify_any(both[0]) == verify_proof(both[0])


@pytest.mark.parametrize(
    ("proofs", "error"),
    [
        ([node_proof(VOLUNTEER, None)], "not linked to this account"),
        ([node_proof(VOLUNTEER, SECOND.public_key)], "not linked to this account"),
        (
            [node_proof(VOLUNTEER, ACCOUNT.public_key)] * 2,
            "counts a node's credit in a project twice",
        ),
    ],
)
def test_an_account_proof_takes_only_its_own_computers_once(proofs, error):
    with pytest.raises(ProofError, match=error):
        verify_account_proof(account_proof_bytes(ACCOUNT.public_key, proofs))


def test_a_link_signed_by_another_key_than_the_contributors_fails():
    forged = AccountLink.sign(SECOND, ACCOUNT.public_key, 1.8e9)  # not VOLUNTEER's key
    s = statement()
    with pytest.raises(ProofError, match="not signed by the contributor"):
        verify_proof(proof_bytes(SIGNED, VOLUNTEER.public_key, [s], forged))


def test_link_merge_and_verify_on_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from core.cli import app
    from core.paths import identity_path
    from net.identity import load_or_create

    runner = CliRunner()
    homes = [tmp_path / "first", tmp_path / "second"]
    # the first computer makes the account, the second links to it
    result = runner.invoke(app, ["--data-dir", str(homes[0]), "credit", "link"])
    assert result.exit_code == 0, result.output
    account = result.output.split("credit link ")[1].split()[0]
    result = runner.invoke(app, ["--data-dir", str(homes[1]), "credit", "link", account])
    assert result.exit_code == 0, result.output
    # each computer's proof (as `moehome credit` writes it, with its link)
    from core.node.credit import link_for

    files = []
    for i, home in enumerate(homes):
        node = load_or_create(identity_path(home, "node"))
        link = link_for(home, node.public_key)
        assert link is not None
        assert link.account.hex() == account
        s = CreditStatement.sign(
            AGGREGATORS[0], SIGNED.project_id, node.public_key, {20_000: 1.0 + i}, 0.0, 1.8e9
        )
        files.append(tmp_path / f"{i}.proof")
        files[-1].write_bytes(proof_bytes(SIGNED, node.public_key, [s], link))
    merged = tmp_path / "account.proof"
    result = runner.invoke(app, ["credit", "merge", *map(str, files), "-o", str(merged)])
    assert result.exit_code == 0, result.output
    assert "3.0 in all" in result.output
    result = runner.invoke(app, ["credit", "verify", str(merged)])
    assert result.exit_code == 0, result.output
    assert f"account {account}: credit 3.0 from 2 computer(s)" in result.output
    # a proof of a computer not linked to it cannot join
    result = runner.invoke(
        app,
        ["credit", "merge", str(files[0]), str(tmp_path / "x.proof"), "-o", str(merged)],
    )
    assert result.exit_code == 2
    assert "cannot read" in result.output
    (tmp_path / "x.proof").write_bytes(node_proof(OUTSIDER, None))
    result = runner.invoke(
        app, ["credit", "merge", str(files[0]), str(tmp_path / "x.proof"), "-o", str(merged)]
    )
    assert result.exit_code == 1
    assert "linked to the same account" in result.output
