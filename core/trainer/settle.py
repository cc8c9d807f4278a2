"""The experts' last round before the final evaluation.

A trainer's last batches leave their gradients with the volunteers, who send them to the
aggregators just before a round closes; the round that applies them comes after the
last step. An
evaluation made at once measures weights without the last round of learning, and a
comparison of runs (time to the same loss) measures the swarm a round behind. So, when
asked, the trainer waits for every expert that answered it to have a newer version
declared than the one its last answers came from, then for the volunteers to pull it
(they look twice a round), and only then evaluates. The wait is bounded: a round needs
its contributors, and a swarm that stopped may never close one. An expert whose
aggregator says, a round after the last step, that its round is stalled for want of
contributors is not waited for any longer: the volunteers' last contributions are in,
and no more are coming.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import trio

log = logging.getLogger(__name__)

#: the newest version of an expert declared by the project's aggregators (None: none yet)
NewestVersion = Callable[[str], Awaitable[int | None]]

#: the experts the project's aggregators report stalled: a round due, short of
#: contributors (agg.stats ``short_of_contributors``)
Stalled = Callable[[], Awaitable[frozenset[str]]]

#: how often the declared versions are looked up while waiting
LOOK_EVERY_S = 1.0


@dataclass(frozen=True)
class Settled:
    """How the wait ended: ``applied`` when every expert had a newer version;
    ``behind``: the uids still at the version their last answers came from."""

    applied: bool
    seconds: float
    behind: tuple[str, ...]


async def await_next_round(
    served: Mapping[str, int],
    newest: NewestVersion,
    wait_s: float,
    pull_s: float,
    *,
    stalled: Stalled | None = None,
    round_s: float = 0.0,
) -> Settled:
    """Wait at most ``wait_s`` until every uid of ``served`` (the version its last
    answers came from) has a newer version declared, then ``pull_s`` for the volunteers
    to serve it (within the same bound). From ``round_s`` after the start on, the uids
    ``stalled`` names are waited for no longer."""
    started = trio.current_time()
    if not served:
        return Settled(True, 0.0, ())  # no expert answered: no round to wait for
    deadline = started + wait_s
    behind = dict(served)
    found: dict[str, int | None] = {}

    async def look(uid: str) -> None:
        found[uid] = await newest(uid)

    stuck: set[str] = set()
    while behind:
        async with trio.open_nursery() as nursery:
            for uid in behind:
                nursery.start_soon(look, uid)
        behind = {uid: v for uid, v in behind.items() if _not_newer(found[uid], v)}
        if behind and stalled is not None and trio.current_time() - started >= round_s:
            stuck |= set(behind) & await stalled()
            behind = {uid: v for uid, v in behind.items() if uid not in stuck}
        if not behind or trio.current_time() + LOOK_EVERY_S > deadline:
            break
        await trio.sleep(LOOK_EVERY_S)
    if stuck:
        log.info(
            "%d experts cannot close a round after the last step (their aggregators wait "
            "for more contributors): evaluating them as they are",
            len(stuck),
        )
    if behind:
        log.info(
            "%d experts had no round after the last step within %.0f s: evaluating as they are",
            len(behind),
            wait_s,
        )
    elif len(stuck) < len(served):  # some have a newer version: let the volunteers pull it
        await trio.sleep(max(0.0, min(pull_s, deadline - trio.current_time())))
    late = tuple(sorted({*behind, *stuck}))
    return Settled(not late, trio.current_time() - started, late)


def _not_newer(declared: int | None, served: int) -> bool:
    return declared is None or declared <= served
