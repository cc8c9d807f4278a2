"""The node's credit: now and then it asks the project's aggregators for their signed
statements about its key (core/project/credit_proof.py), keeps the proof in its data
folder and shows the figures in its status (the tray, ``moehome status``)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from core.control.models import Credit, CreditDay
from core.files import replace_file
from core.project.credit_proof import (
    ProofError,
    collect_statements,
    proof_bytes,
    verify_proof,
)
from core.project.leaderboard import leaderboard, rank_of
from core.project.owner import aggregator_statistics
from core.project.signed import SignedManifest
from core.protocol.aggregator_methods import MAX_CONTRIBUTORS_LISTED
from core.protocol.credit import AccountLink, day_of
from core.protocol.fields import MessageError
from net import Peer

log = logging.getLogger(__name__)

#: seconds between two looks (credit moves with the aggregators' rounds, a minute or more)
CHECK_EVERY_S = 600.0


def proof_path(data_dir: Path, project: str) -> Path:
    return data_dir / "credit" / f"{project}.proof"


def link_path(data_dir: Path) -> Path:
    return data_dir / "credit" / "account.link"


def load_link(data_dir: Path) -> AccountLink | None:
    """The account this node's credit counts for (``moehome credit link``), if any."""
    path = link_path(data_dir)
    try:
        return AccountLink.decode(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, MessageError) as exc:
        log.warning("ignoring the account link in %s: %s", path, exc)
        return None


def link_for(data_dir: Path, contributor: bytes) -> AccountLink | None:
    """This node's link, if it is one of ``contributor``'s key."""
    link = load_link(data_dir)
    return link if link is not None and link.node == contributor else None


def save_link(data_dir: Path, link: AccountLink) -> Path:
    path = link_path(data_dir)
    replace_file(path, link.encode())
    return path


async def check_credit(
    peer: Peer, signed: SignedManifest, contributor: bytes, data_dir: Path
) -> Credit:
    """The aggregators' statements about ``contributor`` now, verified as anyone would
    verify them; the proof written where ``proof_path`` says."""
    statements, missing = await collect_statements(peer, signed, contributor)
    for key, why in missing.items():
        log.info("no credit statement from aggregator %s: %s", key[:16], why)
    data = proof_bytes(signed, contributor, statements, link_for(data_dir, contributor))
    try:
        verified = verify_proof(data)
    except ProofError as exc:  # collect_statements checked each: a bug of ours
        log.warning("the credit proof does not verify: %s", exc)
        return Credit(aggregators_listed=len(signed.manifest.aggregators))
    path = proof_path(data_dir, signed.project_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, data)
    # the rank: the aggregators' signed accounts, as the project page ranks them
    accounts = await aggregator_statistics(peer, signed)
    rows = leaderboard([a.to_obj() for a in accounts], limit=MAX_CONTRIBUTORS_LISTED)
    now = time.time()
    return Credit(
        total=verified.total,
        today=verified.per_day().get(day_of(now), 0.0),
        revoked=verified.revoked,
        aggregators=len(verified.statements),
        aggregators_listed=len(signed.manifest.aggregators),
        checked_at=now,
        proof=str(path),
        rank=rank_of(contributor.hex(), rows),
        ranked=len(rows),
        days=[CreditDay(day=day, credit=credit) for day, credit in verified.per_day().items()],
    )
