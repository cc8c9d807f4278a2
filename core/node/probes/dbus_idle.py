"""Idle time over the D-Bus session bus, for desktops without X11 (Wayland GNOME, KDE).

Asks, in order, GNOME's ``org.gnome.Mutter.IdleMonitor.GetIdletime`` and the freedesktop
``org.freedesktop.ScreenSaver.GetSessionIdleTime``. Blocking I/O (jeepney): the probes run
in a worker thread, and every call is bounded by a short timeout."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from jeepney import DBusAddress, DBusErrorResponse, MessageFlag, new_method_call
from jeepney.io.blocking import open_dbus_connection
from jeepney.wrappers import unwrap_msg  # not re-exported by the package

log = logging.getLogger(__name__)

# Errors that mean "nobody owns that name (yet)": a desktop still starting when the node is
# autostarted at login. Asked again later; any other error means the method is not there.
_NOT_THERE_YET = frozenset(
    {"org.freedesktop.DBus.Error.NameHasNoOwner", "org.freedesktop.DBus.Error.ServiceUnknown"}
)


@dataclass(frozen=True)
class _IdleMethod:
    bus_name: str
    path: str
    interface: str
    member: str
    seconds_per_unit: float

    @property
    def name(self) -> str:
        return f"{self.interface}.{self.member}"


_METHODS = (
    # GNOME (Mutter), X11 and Wayland alike: uint64 milliseconds.
    _IdleMethod(
        "org.gnome.Mutter.IdleMonitor",
        "/org/gnome/Mutter/IdleMonitor/Core",
        "org.gnome.Mutter.IdleMonitor",
        "GetIdletime",
        1e-3,
    ),
    # KDE's kscreenlocker answers with KIdleTime::idleTime(), which is in milliseconds
    # despite the old freedesktop draft saying seconds; KDE is the implementation that
    # matters here, so milliseconds. (On Plasma Wayland it answers NotSupported.)
    _IdleMethod(
        "org.freedesktop.ScreenSaver",
        "/org/freedesktop/ScreenSaver",
        "org.freedesktop.ScreenSaver",
        "GetSessionIdleTime",
        1e-3,
    ),
)


class DbusIdle:
    """Session idle time in seconds from the desktop over D-Bus, or None when unknown.

    The connection is opened on first use and kept; a method the desktop does not provide
    (an error reply) is not asked again on that connection, one whose service is not running
    not before ``retry_interval`` seconds; after a failure to connect or a lost bus, the next
    attempt waits ``retry_interval`` seconds too. Never raises."""

    def __init__(
        self,
        address: str | None = None,
        *,
        call_timeout: float = 1.0,
        retry_interval: float = 30.0,
    ) -> None:
        self._address = address or os.environ.get("DBUS_SESSION_BUS_ADDRESS")
        self._call_timeout = call_timeout
        self._retry_interval = retry_interval
        self._conn: Any = None
        # Closes the socket if the owner is dropped without close(), so no ResourceWarning.
        self._closer: weakref.finalize[..., Any] | None = None
        self._next_connect = 0.0  # time.monotonic() before which we do not try to connect
        self._skip_until: dict[str, float] = {}  # method name -> time.monotonic()
        self._lock = threading.Lock()  # the worker thread may differ between reads

    @property
    def skipped(self) -> frozenset[str]:
        """Methods not asked for now (``interface.member``)."""
        now = time.monotonic()
        return frozenset(name for name, until in self._skip_until.items() if until > now)

    def idle_seconds(self) -> float | None:
        with self._lock:
            conn = self._connection()
            if conn is None:
                return None
            try:
                return self._ask(conn)
            except Exception as exc:  # noqa: BLE001 - a lost bus or a broken stream: unknown
                log.info(
                    "session bus failed (%r); reconnecting in %.0f s", exc, self._retry_interval
                )
                self._drop()
                self._next_connect = time.monotonic() + self._retry_interval
                return None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _connection(self) -> Any:
        if self._conn is not None:
            return self._conn
        if not self._address or time.monotonic() < self._next_connect:
            return None
        self._next_connect = time.monotonic() + self._retry_interval
        try:
            conn = open_dbus_connection(bus=self._address, auth_timeout=self._call_timeout)
        except Exception as exc:  # noqa: BLE001 - no bus, an odd address or transport
            log.info("no session bus at %s: %r", self._address, exc)
            return None
        self._conn = conn
        self._closer = weakref.finalize(self, conn.close)
        # A new connection may be a new desktop session: give every method another chance.
        self._skip_until.clear()
        return conn

    def _drop(self) -> None:
        if self._closer is not None:
            self._closer()
        self._conn = self._closer = None

    def _ask(self, conn: Any) -> float | None:
        for method in _METHODS:
            if self._skip_until.get(method.name, 0.0) > time.monotonic():
                continue
            msg = new_method_call(
                DBusAddress(method.path, bus_name=method.bus_name, interface=method.interface),
                method.member,
            )
            # Asking must never start a service through D-Bus activation.
            msg.header.flags |= MessageFlag.no_auto_start
            try:
                body = unwrap_msg(conn.send_and_get_reply(msg, timeout=self._call_timeout))
            except DBusErrorResponse as exc:
                later = exc.name in _NOT_THERE_YET
                # Said once; a desktop that never comes would repeat it every retry.
                level = logging.DEBUG if method.name in self._skip_until else logging.INFO
                log.log(
                    level,
                    "%s unavailable (%s); %s",
                    method.name,
                    exc,
                    f"asking again in {self._retry_interval:.0f} s"
                    if later
                    else "not asking again",
                )
                self._skip(method, self._retry_interval if later else math.inf)
                continue
            except TimeoutError:
                # A busy desktop, not a missing one: try the next method, and this one later.
                log.debug("%s timed out", method.name)
                continue
            value = body[0] if len(body) == 1 else None
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                log.info("%s replied %r; not asking again", method.name, body)
                self._skip(method, math.inf)
                continue
            return value * method.seconds_per_unit
        return None

    def _skip(self, method: _IdleMethod, seconds: float) -> None:
        self._skip_until[method.name] = time.monotonic() + seconds
