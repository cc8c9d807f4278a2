"""A backward call answered once, whatever the number of times it is sent.

A trainer whose backward call failed on its side (a timeout on a slow volunteer) sends
it again with the same receipt: the receipt says which batch the gradients belong to, so
that a batch is counted once. Refusing the repeat ("batch id used before") lost that
expert's input gradient and, on a volunteer that was the expert's only server, the
trainer's whole step (an owner's walk: one tray volunteer serving all 32 experts). Now
the first answer is kept and given to a repeat; a repeat that comes while the first
still runs waits for it; a first try that failed leaves nothing, and a repeat computes.
Kept answers are bounded in number and bytes (the oldest go first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Final

import trio

from net import Reply

MOST_ANSWERS: Final = 256
MOST_BYTES: Final = 32 * 2**20
#: How long a first try goes on after its caller left (a backward pass takes seconds).
SHIELD_S: Final = 120.0


def reply_bytes(reply: Reply) -> int:
    return sum(memoryview(t.data).nbytes for t in reply.tensors)


class AnsweredOnce:
    def __init__(self, most: int = MOST_ANSWERS, most_bytes: int = MOST_BYTES) -> None:
        self.most, self.most_bytes = most, most_bytes
        self._done: OrderedDict[Hashable, Reply] = OrderedDict()
        self._bytes = 0
        self._running: dict[Hashable, trio.Event] = {}
        #: repeats answered from what was kept
        self.repeats = 0

    async def once(self, key: Hashable, compute: Callable[[], Awaitable[Reply]]) -> Reply:
        """``compute()``'s reply for ``key``: computed the first time, kept after."""
        while key not in self._done:
            running = self._running.get(key)
            if running is None:
                return await self._compute(key, compute)
            await running.wait()  # the first try's end; it may have failed
        self.repeats += 1
        self._done.move_to_end(key)
        return self._done[key]

    async def _compute(self, key: Hashable, compute: Callable[[], Awaitable[Reply]]) -> Reply:
        ended = self._running[key] = trio.Event()
        try:
            # the trainer that timed out closed its call, which cancels this handler: the
            # work (and its gradient, counted) goes on to the end, for the repeat to come
            with trio.CancelScope(shield=True, deadline=trio.current_time() + SHIELD_S):
                reply = await compute()
                self._keep(key, reply)
            return reply
        finally:
            del self._running[key]
            ended.set()

    def _keep(self, key: Hashable, reply: Reply) -> None:
        size = reply_bytes(reply)
        if size > self.most_bytes:
            return
        self._done[key] = reply
        self._bytes += size
        while len(self._done) > self.most or self._bytes > self.most_bytes:
            _, old = self._done.popitem(last=False)
            self._bytes -= reply_bytes(old)
