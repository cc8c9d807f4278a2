"""What an aggregator's refusal of a contribution means, to both sides: an offence (the
contributor sent something no honest volunteer sends: it counts toward a ban) or the
normal course of a project (no strike, never a ban; the volunteer comes back later or
refreshes its weights). Pure.

An owner's first real project showed why the line matters: a lone honest volunteer
facing ``min_contributors = 3`` had its surplus refused as ``waiting_for_contributors``
15 times a second, the refusals were counted as junk of its address, and the address
(with the owner's own trainer behind it) was banned 13 times in 15 minutes; with
``min_contributors = 1`` it was banned for 5 ``stale`` contributions, made stale by the
versions its own contributions made.
"""

from __future__ import annotations

from typing import Final

#: The round of the expert holds enough of this volunteer's samples and waits for other
#: volunteers; what is sent meanwhile would change nothing: come back later.
WAITING: Final = "waiting_for_contributors"
#: Offences from the volunteer's address (other identities, the same home router or
#: carrier-grade NAT) used up its credit: come back later. Never a ban of the address.
SLOW_DOWN: Final = "slow_down"
#: The gradients were computed on weights too old: pull the new ones.
STALE: Final = "stale"

#: Refusals honest volunteers meet in the normal course: no strike, never a ban.
NORMAL: Final = frozenset(
    {
        "replay",  # an earlier try got through; its acknowledgement was lost
        WAITING,
        SLOW_DOWN,
        STALE,
        "future_version",  # the aggregator's state was reset by its owner
        "clock",  # the volunteer's clock is wrong: the status says so
        "banned_by_project",  # counted once, by whoever banned it
        # a trainer whose backward call failed on its side (a timeout) recomputes it
        # elsewhere with the same receipt: two honest servers then hold it, and the
        # second to send it is refused (counting a batch twice is what this prevents)
        "receipt_reused",
    }
)
#: The aggregator banned this contributor for a while (after offences): the refusal is
#: no new offence; sending on until the ban ends would only be refused.
BANNED: Final = "banned"
#: Refusals after which a volunteer waits before sending that expert's gradients again.
COME_BACK_LATER: Final = frozenset({WAITING, SLOW_DOWN, BANNED})


def is_offence(reason: str) -> bool:
    """Whether a refusal for ``reason`` counts against its contributor (and, as junk,
    against its address's credit)."""
    return reason not in NORMAL


def pause_after(reason: str, repeats: int, round_seconds: float, most: float = 600.0) -> float:
    """Seconds a volunteer waits before sending gradients of an expert again after the
    ``repeats``-th refusal for ``reason`` in a row (1: the first): a round's time,
    doubling while the refusals go on, at most ``most``; 0 when it need not wait."""
    if reason not in COME_BACK_LATER or repeats < 1:
        return 0.0
    return float(min(most, round_seconds * 2 ** min(repeats - 1, 16)))
