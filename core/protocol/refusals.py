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

import enum
from typing import Final


class Refusal(enum.StrEnum):
    """Every reason an aggregator refuses a contribution for: the code both ends speak
    (the aggregator's RPC error code, the volunteer's outcome). A code from a newer
    aggregator may be none of these: the functions below take any string."""

    # the contribution's claims (checked from its header, before its payload)
    WRONG_PROJECT = "wrong_project"
    UNKNOWN_EXPERT = "unknown_expert"
    NOT_A_TRAINER = "not_a_trainer"  # only the project's trainers change the trunk
    REPLAY = "replay"
    CLOCK = "clock"
    FUTURE_VERSION = "future_version"
    #: The gradients were computed on weights too old: pull the new ones.
    STALE = "stale"
    NO_RECEIPTS = "no_receipts"
    FOREIGN_RECEIPT = "foreign_receipt"
    RECEIPT_REUSED = "receipt_reused"
    INFLATED_SAMPLES = "inflated_samples"
    SHAPE = "shape"
    CODEC = "codec"
    # the message itself and its payload
    MALFORMED = "malformed"
    NOT_YOURS = "not_yours"
    BAD_SIGNATURE = "bad_signature"
    PAYLOAD_MISMATCH = "payload_mismatch"
    NON_FINITE = "non_finite"
    #: The round of the expert holds enough of this volunteer's samples and waits for
    #: other volunteers; what is sent meanwhile would change nothing: come back later.
    WAITING = "waiting_for_contributors"
    #: Offences from the volunteer's address (other identities, the same home router or
    #: carrier-grade NAT) used up its credit: come back later. Never a ban of the address.
    SLOW_DOWN = "slow_down"
    #: The aggregator banned this contributor for a while (after offences): the refusal
    #: is no new offence; sending on until the ban ends would only be refused.
    BANNED = "banned"
    BANNED_BY_PROJECT = "banned_by_project"


WAITING: Final = Refusal.WAITING
SLOW_DOWN: Final = Refusal.SLOW_DOWN
STALE: Final = Refusal.STALE
BANNED: Final = Refusal.BANNED

#: Refusals honest volunteers meet in the normal course: no strike, never a ban.
NORMAL: Final = frozenset(
    {
        Refusal.REPLAY,  # an earlier try got through; its acknowledgement was lost
        Refusal.WAITING,
        Refusal.SLOW_DOWN,
        Refusal.STALE,
        Refusal.FUTURE_VERSION,  # the aggregator's state was reset by its owner
        Refusal.CLOCK,  # the volunteer's clock is wrong: the status says so
        Refusal.BANNED_BY_PROJECT,  # counted once, by whoever banned it
        # a trainer whose backward call failed on its side (a timeout) recomputes it
        # elsewhere with the same receipt: two honest servers then hold it, and the
        # second to send it is refused (counting a batch twice is what this prevents)
        Refusal.RECEIPT_REUSED,
    }
)
#: Refusals after which a volunteer waits before sending that expert's gradients again.
COME_BACK_LATER: Final = frozenset({Refusal.WAITING, Refusal.SLOW_DOWN, Refusal.BANNED})


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


#: What a refusal means to the volunteer, in words (the dashboard's event log).
_IN_WORDS: Final = {
    Refusal.WAITING: "the expert waits for other volunteers' work first; normal",
    Refusal.STALE: "computed on weights that have since changed; the new ones are fetched",
    Refusal.REPLAY: "already received; normal after a lost acknowledgement",
    Refusal.RECEIPT_REUSED: "the trainer had this batch computed twice; normal",
    Refusal.FUTURE_VERSION: "the project's aggregator was reset; new weights are fetched",
    Refusal.CLOCK: "this computer's clock is wrong; set it right",
    Refusal.SLOW_DOWN: "too many refusals from this network address; sending later",
    Refusal.BANNED: "the aggregator refuses this computer's work for a while",
    Refusal.BANNED_BY_PROJECT: "the project banned this computer",
}


def in_words(reason: str) -> str:
    """Why a contribution was refused, for the volunteer: normal refusals said as such,
    an offence as the code the aggregator gave."""
    words = _IN_WORDS.get(reason)  # type: ignore[call-overload]  # any string may come
    return words if words is not None else f"rejected as invalid ({reason})"
