"""An emulated home link for the rig (the emulated swarm, tests, the demo's slow
volunteers): the answers a peer serves leave through an uplink of a given rate, one
after another, and arrive ``delay`` seconds later. Given to a peer as its RPC config's
``link`` (net/rpc/calls.py ``ReplyLink``); a real peer has none."""

from __future__ import annotations

from dataclasses import dataclass, field

import trio


@dataclass
class EmulatedLink:
    #: seconds every answer is held, as a slow link's latency (0: none)
    delay: float = 0.0
    #: the uplink's bytes per second; answers queue behind each other (0: no limit)
    upload_bytes_per_second: float = 0.0
    _uplink: trio.Lock = field(default_factory=trio.Lock, repr=False)

    async def carry(self, nbytes: int) -> None:
        if self.upload_bytes_per_second > 0:
            async with self._uplink:  # one answer on the uplink at a time
                await trio.sleep(nbytes / self.upload_bytes_per_second)
        if self.delay > 0:
            await trio.sleep(self.delay)
