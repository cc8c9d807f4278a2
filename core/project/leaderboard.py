"""A project's credit leaderboard from its aggregators' signed accounts (agg.stats:
each lists its contributors with the most credit): credit summed over aggregators, ranked.
The project page shows it; a node finds its own rank in it (core/node/credit.py). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from net.identity import peer_id_from_public_key

#: the page's leaderboard length
LEADERS: Final = 100


def leaderboard(
    aggregators: Sequence[dict[str, Any]], limit: int = LEADERS
) -> list[dict[str, Any]]:
    """Contributors by credit (summed over the aggregators' signed accounts), then by
    contributions accepted: ``{rank, peer, key, credit, revoked, accepted, rounds,
    samples}`` (samples: those rounds applied; credit is them times the share kept).
    Pure."""
    rows: dict[str, dict[str, Any]] = {}
    for agg in aggregators:
        for key, c in agg.get("contributors", {}).items():
            row = rows.setdefault(
                key,
                {
                    "key": key,
                    "credit": 0.0,
                    "revoked": 0.0,
                    "accepted": 0,
                    "rounds": 0,
                    "samples": 0,
                },
            )
            row["credit"] += float(c.get("credit", 0.0))
            row["revoked"] += float(c.get("credit_revoked", 0.0))
            row["accepted"] += int(c.get("accepted", 0))
            row["rounds"] += int(c.get("rounds", 0))
            row["samples"] += int(c.get("samples", 0))  # aggregators since 2026-11-28
    ordered = sorted(rows.values(), key=lambda r: (-r["credit"], -r["accepted"], r["key"]))
    out = []
    for rank, row in enumerate(ordered[:limit], start=1):
        try:
            peer = str(peer_id_from_public_key(bytes.fromhex(row["key"])))
        except ValueError:
            continue  # an aggregator's account names keys; a malformed one is skipped
        out.append({"rank": rank, "peer": peer, **row})
    return out


def rank_of(key: str, rows: Sequence[dict[str, Any]]) -> int | None:
    """``key``'s (hex public key) rank on a leaderboard with credit (None: not on it, or
    nothing earned yet)."""
    return next((r["rank"] for r in rows if r["key"] == key and r["credit"] > 0), None)
