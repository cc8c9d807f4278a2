"""Who an expert server takes work from, decided from a request's head before its
payload is read: the project's trainers first; strangers in small batches, at a bounded
rate per source address and all together; nobody while the volunteer is paused."""

from __future__ import annotations

from collections.abc import Callable, Collection

import trio

from core.experts.batching import STRANGER, TRAINER, TaskPool
from net import Overloaded, PeerID, RateLimited, RemoteError, RequestHead, TooLarge, Unavailable
from net.ratelimit import Admission, PeerRateLimiter, RateLimits

#: The rate limiter's key for all strangers together.
_ALL_STRANGERS = "*"

PAUSED = "this volunteer is paused"


class ServerAdmission:
    """``trainers``: the project's trainers (empty: every caller is treated alike, the
    demo project). ``stranger_batch``: the most rows a stranger may send at once;
    ``stranger_rows_per_second``: per source address (None: 4 stranger batches)."""

    def __init__(
        self,
        trainers: Collection[PeerID],
        *,
        stranger_batch: int,
        stranger_rows_per_second: float | None,
        paused: Callable[[], bool],
    ) -> None:
        self.trainers = frozenset(trainers)
        self.stranger_batch = stranger_batch
        self._paused = paused
        rows_per_second = stranger_rows_per_second or 4.0 * stranger_batch
        self._stranger_rates: PeerRateLimiter[str] = PeerRateLimiter(
            RateLimits(requests_per_second=rows_per_second, request_burst=2 * rows_per_second)
        )

    def is_trainer(self, caller: object) -> bool:
        return not self.trainers or caller in self.trainers

    def priority(self, caller: object) -> int:
        return TRAINER if self.is_trainer(caller) else STRANGER

    def refusal(self) -> BaseException | None:
        """What a queued request gets once the volunteer paused (None: go on)."""
        return Unavailable(PAUSED) if self._paused() else None

    def screen(
        self, head: RequestHead, pools: Callable[[str, str], TaskPool | None]
    ) -> RemoteError | None:
        """Refuse from the header, before the payload is read: a stranger's request
        larger than a stranger's batch, or one that would not be queued now.
        ``pools(method, uid)``: the queue the request would join (None: no such expert,
        which the handler explains)."""
        if self._paused():
            return Unavailable(PAUSED)
        uid = head.meta.get("uid")
        pool = pools(head.method, uid) if isinstance(uid, str) else None
        if pool is None or not head.specs or not head.specs[0][1]:
            return None  # the handler explains what is wrong
        rows = head.specs[0][1][0]
        if not self.is_trainer(head.peer_id):
            if rows > self.stranger_batch:
                return TooLarge(f"this server takes at most {self.stranger_batch} rows from you")
            now = trio.current_time()
            if self._stranger_rates.admit(head.source, 0, now, requests=float(rows)) is not (
                Admission.ADMIT
            ):
                return RateLimited("too many rows from your address; slow down")
            # all strangers together, from however many addresses: a few times one's
            # share, so the device mostly waits for the project's trainers
            everyone = self._stranger_rates.admit(_ALL_STRANGERS, 0, now, requests=rows / 4)
            if everyone is not Admission.ADMIT:
                return Overloaded("serving strangers at full rate; retry later")
        if not pool.room_for(head.peer_id, rows):
            return Overloaded(f"{pool.name}: queue full; retry later")
        return None
