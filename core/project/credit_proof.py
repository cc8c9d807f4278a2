"""A volunteer's proof of credit: the project's signed manifest and each aggregator's
signed credit statement (core/protocol/credit.py) about one contributor key, in one
file. Anyone can check it with nothing but the file: the manifest is signed by the
owner's key chain (its project id follows from the origin key), and each statement by a
key the manifest lists as an aggregator. Credit adds up over aggregators (each keeps the
books of its own experts).

    {"format": "moehome-credit-proof/1", "manifest": <signed manifest>,
     "contributor": <32 bytes>, "statements": [<statement>, ...],
     "link": <the node's AccountLink, optional>}   (msgpack)

A volunteer's several computers (or projects) add up under one account: each node signs
a link to the account key, and an account proof gathers their proofs
(``account_proof_bytes``, ``verify_account_proof``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

from core.errors import UserFacingError
from core.project.distribution import aggregator_peers
from core.project.signed import ManifestRejected, SignedManifest
from core.protocol.credit import CREDIT, AccountLink, CreditStatement
from core.protocol.fields import MessageError
from net import Peer, RemoteError, RpcError
from net.codec import pack, unpack_bounded

log = logging.getLogger(__name__)

FORMAT: Final = "moehome-credit-proof/1"
ACCOUNT_FORMAT: Final = "moehome-credit-account/1"
#: node proofs one account proof gathers
MAX_ACCOUNT_PROOFS: Final = 1024
#: a proof holds the manifest and a statement per aggregator: well under this
MAX_PROOF_BYTES: Final = 16 * 1024 * 1024
MAX_STATEMENTS: Final = 256


class ProofError(UserFacingError, ValueError):
    """A proof file that does not prove what it claims, and why."""


@dataclass(frozen=True)
class VerifiedCredit:
    project_id: str
    project_name: str
    contributor: bytes
    #: per aggregator (hex key): its statement
    statements: dict[str, CreditStatement]
    #: the account the node's credit counts for (its signed link), if any
    account: bytes | None = None

    @property
    def total(self) -> float:
        return sum(s.total for s in self.statements.values())

    @property
    def revoked(self) -> float:
        return sum(s.revoked for s in self.statements.values())

    def per_day(self) -> dict[int, float]:
        """Credit per UTC day, all aggregators together (day -1: before those listed)."""
        out: dict[int, float] = {}
        for s in self.statements.values():
            for day, credit in s.days:
                out[day] = out.get(day, 0.0) + credit
        return dict(sorted(out.items()))

    def to_obj(self) -> dict[str, Any]:
        return {
            "project_id": self.project_id,
            "project": self.project_name,
            "contributor": self.contributor.hex(),
            "account": None if self.account is None else self.account.hex(),
            "total": self.total,
            "revoked": self.revoked,
            "per_day": [[d, c] for d, c in self.per_day().items()],
            "aggregators": {
                key: {"total": s.total, "issued": s.issued} for key, s in self.statements.items()
            },
        }


def proof_bytes(
    signed: SignedManifest,
    contributor: bytes,
    statements: list[CreditStatement],
    link: AccountLink | None = None,
) -> bytes:
    obj: dict[str, Any] = {
        "format": FORMAT,
        "manifest": signed.encode(),
        "contributor": contributor,
        "statements": [s.encode() for s in statements],
    }
    if link is not None:
        obj["link"] = link.encode()
    return pack(obj)


def _proof_object(data: bytes) -> dict[str, Any]:
    """A proof file's top-level map, of any format, size bounded before it is read."""
    if len(data) > MAX_PROOF_BYTES:
        raise ProofError(f"a credit proof is at most {MAX_PROOF_BYTES} bytes; this is {len(data)}")
    try:
        obj = unpack_bounded(data, MAX_PROOF_BYTES)
    except Exception as exc:  # msgpack's errors on garbage
        raise ProofError(f"not a credit proof: {exc}") from exc
    if not isinstance(obj, dict):
        raise ProofError("not a credit proof (a map expected)")
    return obj


def verify_proof(data: bytes) -> VerifiedCredit:
    """What a proof file proves; ProofError says why it proves nothing."""
    return _verify_node_proof(_proof_object(data))


def _verify_node_proof(obj: dict[str, Any]) -> VerifiedCredit:
    if obj.get("format") != FORMAT:
        raise ProofError(f"not a credit proof (format {FORMAT} expected)")
    manifest, contributor, raw = obj.get("manifest"), obj.get("contributor"), obj.get("statements")
    if not isinstance(manifest, bytes) or not isinstance(contributor, bytes):
        raise ProofError("a credit proof carries a signed manifest and a contributor key")
    if len(contributor) != 32:
        raise ProofError("the contributor key must be 32 bytes")
    if not isinstance(raw, list) or len(raw) > MAX_STATEMENTS:
        raise ProofError(f"a credit proof lists at most {MAX_STATEMENTS} statements")
    try:
        signed = SignedManifest.decode(manifest)
        signed.verify()
    except ManifestRejected as exc:
        raise ProofError(f"the project's manifest does not verify: {exc}") from exc
    m = signed.manifest
    aggregators = {a.key.lower() for a in m.aggregators}
    statements: dict[str, CreditStatement] = {}
    for i, blob in enumerate(raw):
        if not isinstance(blob, bytes):
            raise ProofError(f"statement {i} is not bytes")
        try:
            s = CreditStatement.decode(blob)
        except MessageError as exc:
            raise ProofError(f"statement {i} is malformed: {exc}") from exc
        key = s.aggregator.hex()
        if key not in aggregators:
            raise ProofError(f"statement {i} is by {key[:16]}, not an aggregator of the project")
        if not s.verify():
            raise ProofError(f"statement {i}'s signature does not verify (altered?)")
        if s.project != signed.project_id:
            raise ProofError(f"statement {i} is about another project ({s.project})")
        if s.contributor != contributor:
            raise ProofError(f"statement {i} is about another contributor")
        if key in statements:
            raise ProofError(f"two statements of aggregator {key[:16]}: a proof holds one each")
        statements[key] = s
    account = None
    if obj.get("link") is not None:
        raw_link = obj["link"]
        try:
            link = AccountLink.decode(raw_link if isinstance(raw_link, bytes) else b"")
        except MessageError as exc:
            raise ProofError(f"the account link is malformed: {exc}") from exc
        if link.node != contributor or not link.verify():
            raise ProofError("the account link is not signed by the contributor's key")
        account = link.account
    return VerifiedCredit(signed.project_id, m.project.name, contributor, statements, account)


@dataclass(frozen=True)
class AccountCredit:
    account: bytes
    #: each node's proof in each project, verified
    proofs: list[VerifiedCredit]

    @property
    def total(self) -> float:
        return sum(p.total for p in self.proofs)

    def per_project(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for p in self.proofs:
            out[p.project_id] = out.get(p.project_id, 0.0) + p.total
        return out

    def to_obj(self) -> dict[str, Any]:
        return {
            "account": self.account.hex(),
            "total": self.total,
            "per_project": self.per_project(),
            "nodes": sorted({p.contributor.hex() for p in self.proofs}),
            "proofs": [p.to_obj() for p in self.proofs],
        }


def account_proof_bytes(account: bytes, proofs: list[bytes]) -> bytes:
    """Node proofs (``proof_bytes``, each with a link to ``account``) as one."""
    return pack({"format": ACCOUNT_FORMAT, "account": account, "proofs": proofs})


def verify_account_proof(data: bytes) -> AccountCredit:
    """What an account proof proves: every node proof in it verifies and links to the
    account; one proof per node and project."""
    return _verify_account_proof(_proof_object(data))


def _verify_account_proof(obj: dict[str, Any]) -> AccountCredit:
    if obj.get("format") != ACCOUNT_FORMAT:
        raise ProofError(f"not an account's credit proof (format {ACCOUNT_FORMAT} expected)")
    account, raw = obj.get("account"), obj.get("proofs")
    if not isinstance(account, bytes) or len(account) != 32:
        raise ProofError("the account key must be 32 bytes")
    if not isinstance(raw, list) or len(raw) > MAX_ACCOUNT_PROOFS:
        raise ProofError(f"an account proof gathers at most {MAX_ACCOUNT_PROOFS} proofs")
    proofs: list[VerifiedCredit] = []
    seen: set[tuple[str, bytes]] = set()
    for i, blob in enumerate(raw):
        if not isinstance(blob, bytes):
            raise ProofError(f"proof {i} is not bytes")
        try:
            verified = verify_proof(blob)
        except ProofError as exc:
            raise ProofError(f"proof {i}: {exc}") from exc
        if verified.account != account:
            raise ProofError(f"proof {i}'s node is not linked to this account")
        key = (verified.project_id, verified.contributor)
        if key in seen:
            raise ProofError(f"proof {i} counts a node's credit in a project twice")
        seen.add(key)
        proofs.append(verified)
    return AccountCredit(account, proofs)


def verify_any(data: bytes) -> VerifiedCredit | AccountCredit:
    """A node's proof or an account's, whichever ``data`` is."""
    obj = _proof_object(data)
    if obj.get("format") == ACCOUNT_FORMAT:
        return _verify_account_proof(obj)
    return _verify_node_proof(obj)


async def collect_statements(
    peer: Peer, signed: SignedManifest, contributor: bytes, *, timeout: float = 10.0
) -> tuple[list[CreditStatement], dict[str, str]]:
    """Each aggregator's statement about ``contributor`` (checked as ``verify_proof``
    will), and why the others gave none (by aggregator key)."""
    m = signed.manifest
    statements: list[CreditStatement] = []
    missing: dict[str, str] = {}
    for entry, agg in zip(m.aggregators, aggregator_peers(peer, m), strict=True):
        try:
            reply = await peer.rpc.call(agg, CREDIT, {"contributor": contributor}, timeout=timeout)
            blob = reply.meta.get("statement")
            if not isinstance(blob, bytes):
                raise MessageError("no statement in the reply")
            s = CreditStatement.decode(blob)
        except (RemoteError, RpcError, MessageError) as exc:
            missing[entry.key] = str(exc)
            continue
        wrong = (
            s.aggregator.hex() != entry.key.lower()
            or not s.verify()
            or s.project != signed.project_id
            or s.contributor != contributor
        )
        if wrong:
            missing[entry.key] = "its statement did not verify"
            continue
        statements.append(s)
    return statements, missing
