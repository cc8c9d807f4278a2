"""Port mapping on the home router (UPnP IGD through miniupnpc), off by default.

A volunteer who allows it (a preference) lets the node ask the router to forward its
listening port: peers then dial it directly, and reachability (net/reach/reachability.py)
learns so from their dial-backs, as for any other route in. The mapping is leased
(renewed at half its lease) and removed when the node stops, so a node that crashed
leaves nothing open for longer than one lease. NAT-PMP/PCP is not spoken: no maintained
Python library offers it, and routers that speak it mostly speak UPnP IGD too.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import trio

log = logging.getLogger(__name__)

PROTOCOL: Final = "TCP"
#: external ports tried after the one equal to the internal port was refused
_OTHER_PORTS: Final = 3


class Gateway(Protocol):
    """What the node needs of miniupnpc's ``UPnP`` (blocking calls, run in a thread)."""

    discoverdelay: int
    lanaddr: str

    def discover(self) -> int: ...
    def selectigd(self) -> str: ...
    def externalipaddress(self) -> str: ...
    def addportmapping(self, *args: Any) -> bool: ...
    def deleteportmapping(self, *args: Any) -> bool: ...


def miniupnpc_gateway() -> Gateway:
    import miniupnpc  # a C extension; imported only by nodes that map ports

    gateway: Gateway = miniupnpc.UPnP()
    return gateway


@dataclass(frozen=True)
class PortMapConfig:
    #: seconds a mapping lasts unless renewed (renewed at half)
    lease_s: int = 3600
    #: how long discovery waits for routers to answer (milliseconds)
    discover_ms: int = 2000
    #: after no router answered, or it refused: try again this much later
    retry_s: float = 300.0
    description: str = "moehome"


@dataclass
class PortMapStatus:
    """What the router gave: ``mapped`` is internal port -> external port."""

    router: str | None = None
    external_ip: str | None = None
    mapped: dict[int, int] = field(default_factory=dict)
    error: str | None = None


class PortMapper:
    """Maps ``ports()`` on the router while it runs; tells ``on_change`` the external
    ports whenever they change."""

    def __init__(
        self,
        ports: Callable[[], list[int]],
        config: PortMapConfig | None = None,
        *,
        gateway_factory: Callable[[], Gateway] = miniupnpc_gateway,
        on_change: Callable[[list[int]], None] | None = None,
    ) -> None:
        self._ports = ports
        self.config = config or PortMapConfig()
        self._gateway_factory = gateway_factory
        self._on_change = on_change
        self._gateway: Gateway | None = None
        self.status = PortMapStatus()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                ok = await self._map_all()
                await trio.sleep(self.config.lease_s / 2 if ok else self.config.retry_s)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._unmap_all()

    async def _map_all(self) -> bool:
        if self._gateway is None:
            self._gateway = await trio.to_thread.run_sync(self._discover, abandon_on_cancel=True)
            if self._gateway is None:
                return False
        gateway = self._gateway
        before = dict(self.status.mapped)
        for port in self._ports():
            external = await trio.to_thread.run_sync(
                self._map, gateway, port, self.status.mapped.get(port), abandon_on_cancel=True
            )
            if external is None:
                self.status.mapped.pop(port, None)
                self._gateway = None  # the router may have changed: discover again
            else:
                self.status.mapped[port] = external
        if self.status.mapped != before and self._on_change is not None:
            self._on_change(sorted(self.status.mapped.values()))
        return bool(self.status.mapped)

    def _discover(self) -> Gateway | None:
        gateway = self._gateway_factory()
        gateway.discoverdelay = self.config.discover_ms
        try:
            if gateway.discover() < 1:
                self.status.error = "no router answered (UPnP is off on it, or there is none)"
                return None
            self.status.router = gateway.selectigd()
        except Exception as exc:  # noqa: BLE001 - miniupnpc raises bare Exception
            self.status.error = f"no router offers port mapping: {exc}"
            return None
        try:
            self.status.external_ip = gateway.externalipaddress() or None
        except Exception:  # noqa: BLE001 - optional; reachability learns it anyway
            self.status.external_ip = None
        log.info("port mapping: router %s (lan address %s)", self.status.router, gateway.lanaddr)
        return gateway

    def _map(self, gateway: Gateway, port: int, current: int | None) -> int | None:
        """Map (or renew) ``port``: the same external port first, else a few others."""
        wanted = [current or port]
        wanted += [random.randint(20_000, 60_000) for _ in range(_OTHER_PORTS)]
        last = ""
        for external in wanted:
            args = [external, PROTOCOL, gateway.lanaddr, port, self.config.description, ""]
            try:
                try:
                    gateway.addportmapping(*args, self.config.lease_s)
                except Exception as exc:
                    if "725" not in str(exc) and "Permanent" not in str(exc):
                        raise
                    # an IGDv1 router that knows only permanent mappings: removed on
                    # stop like any other
                    gateway.addportmapping(*args, 0)
            except Exception as exc:  # noqa: BLE001
                last = str(exc)
                continue
            self.status.error = None
            if external != current:
                log.info("port mapping: router forwards port %d to our %d", external, port)
            return external
        self.status.error = f"the router refused to forward port {port}: {last}"
        log.info("port mapping: %s", self.status.error)
        return None

    async def _unmap_all(self) -> None:
        gateway, mapped = self._gateway, dict(self.status.mapped)
        self.status.mapped.clear()
        if gateway is None or not mapped:
            return

        def unmap() -> None:
            for external in mapped.values():
                try:
                    gateway.deleteportmapping(external, PROTOCOL)
                except Exception as exc:  # noqa: BLE001 - the lease ends it anyway
                    log.debug("could not remove port mapping %d: %s", external, exc)

        await trio.to_thread.run_sync(unmap, abandon_on_cancel=True)
