"""Port mapping's policy against a router stand-in with miniupnpc's interface (the real
router, miniupnpd in a lab namespace: tests/nat/test_portmap.py)."""

from __future__ import annotations

from typing import Any

import trio

from net.reach.portmap import PortMapConfig, PortMapper


class Router:
    """Answers like miniupnpc's UPnP: exceptions with the router's error text."""

    def __init__(
        self, *, answers: bool = True, taken: set[int] | None = None, permanent_only: bool = False
    ) -> None:
        self.discoverdelay = 0
        self.lanaddr = "198.18.1.10"
        self.answers = answers
        self.taken = taken or set()
        self.permanent_only = permanent_only
        self.mappings: dict[int, tuple[int, int]] = {}  # external -> (internal, lease)
        self.discoveries = 0

    def discover(self) -> int:
        self.discoveries += 1
        return 1 if self.answers else 0

    def selectigd(self) -> str:
        return "http://198.18.1.1:5000/ctl/IPConn"

    def externalipaddress(self) -> str:
        return "198.18.0.100"

    def addportmapping(self, ext: int, proto: str, host: str, port: int, *rest: Any) -> bool:
        lease = rest[2]
        assert proto == "TCP"
        assert host == self.lanaddr
        if ext in self.taken:
            raise Exception("ConflictInMappingEntry (718)")
        if self.permanent_only and lease != 0:
            raise Exception("OnlyPermanentLeasesSupported (725)")
        self.mappings[ext] = (port, lease)
        return True

    def deleteportmapping(self, ext: int, proto: str) -> bool:
        del self.mappings[ext]
        return True


def mapper(router: Router, ports: list[int], changes: list[list[int]]) -> PortMapper:
    return PortMapper(
        lambda: ports,
        PortMapConfig(lease_s=600, discover_ms=10, retry_s=1.0),
        gateway_factory=lambda: router,
        on_change=changes.append,
    )


async def test_the_same_port_is_mapped_with_a_lease_and_renewed_in_place():
    router = Router()
    changes: list[list[int]] = []
    m = mapper(router, [4001], changes)
    assert await m._map_all()
    assert router.mappings == {4001: (4001, 600)}
    assert m.status.mapped == {4001: 4001}
    assert m.status.error is None
    assert m.status.external_ip == "198.18.0.100"
    assert await m._map_all()  # renewal: the same mapping, nothing to tell
    assert router.mappings == {4001: (4001, 600)}
    assert changes == [[4001]]
    assert router.discoveries == 1


async def test_a_port_taken_on_the_router_gets_another_external_port():
    router = Router(taken={4001})
    changes: list[list[int]] = []
    m = mapper(router, [4001], changes)
    assert await m._map_all()
    [(external, (internal, _))] = router.mappings.items()
    assert internal == 4001
    assert external != 4001
    assert 20_000 <= external <= 60_000
    assert changes == [[external]]


async def test_a_router_with_permanent_mappings_only_gets_one_and_it_is_removed_on_stop():
    router = Router(permanent_only=True)
    changes: list[list[int]] = []
    m = mapper(router, [4001], changes)
    async with trio.open_nursery() as nursery:
        await nursery.start(m.run)
        while not router.mappings:
            await trio.sleep(0.01)
        assert router.mappings == {4001: (4001, 0)}
        nursery.cancel_scope.cancel()
    assert router.mappings == {}  # removed on the way out
    assert m.status.mapped == {}


async def test_no_router_is_an_error_to_show_and_a_later_retry():
    router = Router(answers=False)
    changes: list[list[int]] = []
    m = mapper(router, [4001], changes)
    assert not await m._map_all()
    assert m.status.error is not None
    assert "no router answered" in m.status.error
    router.answers = True
    assert await m._map_all()  # the retry discovers again
    assert changes == [[4001]]


async def test_a_router_that_refuses_everything_leaves_nothing_mapped():
    router = Router(taken=set(range(1, 65536)))
    changes: list[list[int]] = []
    m = mapper(router, [4001], changes)
    assert not await m._map_all()
    assert m.status.mapped == {}
    assert changes == []
    assert m.status.error is not None
    assert "refused to forward port 4001" in m.status.error
