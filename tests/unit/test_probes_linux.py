"""The Linux probes: AMD GPUs from a fake sysfs tree; idle time over a real private D-Bus
session bus with fake GNOME and KDE services."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jeepney import HeaderFields, MessageType, message_bus, new_error, new_method_return
from jeepney.io.blocking import DBusConnection, Proxy, open_dbus_connection

from core.node.probes import dbus_idle
from core.node.probes.amd import AmdSysfs
from core.node.probes.base import GpuReader, PortableProbes
from core.node.probes.dbus_idle import DbusIdle
from core.node.probes.linux import LinuxProbes

# ---- AMD: a fake /sys


def _card(root: Path, name: str, driver: str, files: dict[str, str]) -> Path:
    device = root / "class" / "drm" / name / "device"
    device.mkdir(parents=True)
    drivers = root / "bus" / "pci" / "drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    (device / "driver").symlink_to(drivers)
    for rel, text in files.items():
        (device / rel).parent.mkdir(parents=True, exist_ok=True)
        (device / rel).write_text(text + "\n")
    return device


def test_amd_reads_only_amdgpu_cards(tmp_path: Path):
    _card(
        tmp_path,
        "card0",
        "amdgpu",
        {
            "gpu_busy_percent": "37",
            "hwmon/hwmon3/temp1_input": "61000",
            "hwmon/hwmon3/temp1_label": "edge",
            "hwmon/hwmon3/temp2_input": "74000",
            "hwmon/hwmon3/temp2_label": "junction",
            "hwmon/hwmon3/temp3_input": "90000",  # VRAM: not the GPU's temperature
            "hwmon/hwmon3/temp3_label": "mem",
            "hwmon/hwmon3/power1_average": "152000000",
        },
    )
    _card(
        tmp_path,
        "card1",
        "i915",
        {"gpu_busy_percent": "99", "hwmon/hwmon4/temp1_input": "99000"},
    )
    # A connector of card0 is no GPU of its own.
    (tmp_path / "class" / "drm" / "card0-DP-1").mkdir()
    assert AmdSysfs(tmp_path).read() == (74.0, 0.37, 152.0)


def test_amd_combines_gpus_and_falls_back(tmp_path: Path):
    _card(
        tmp_path,
        "card0",
        "amdgpu",
        {
            "gpu_busy_percent": "10",
            "hwmon/hwmon0/temp1_input": "50000",  # unlabelled: temp1 it is
            "hwmon/hwmon0/power1_input": "20000000",  # no power1_average (RDNA3)
        },
    )
    _card(
        tmp_path,
        "card1",
        "amdgpu",
        {
            "gpu_busy_percent": "80",
            "hwmon/hwmon1/temp1_input": "45000",
            "hwmon/hwmon1/power1_average": "100500000",
        },
    )
    _card(
        tmp_path,
        "card2",
        "amdgpu",
        {"power/runtime_status": "suspended", "hwmon/hwmon2/temp1_input": "99000"},
    )
    assert AmdSysfs(tmp_path).read() == (50.0, 0.8, 120.5)


def test_amd_garbage_or_missing_files_are_none(tmp_path: Path):
    _card(
        tmp_path,
        "card0",
        "amdgpu",
        {
            "gpu_busy_percent": "busy",
            "hwmon/hwmon0/temp1_input": "",
            "hwmon/hwmon0/temp1_label": "edge",
            "hwmon/hwmon0/power1_average": "1.5e6",
        },
    )
    _card(tmp_path, "card1", "amdgpu", {})
    (tmp_path / "class" / "drm" / "card2").mkdir()  # no device/driver at all
    assert AmdSysfs(tmp_path).read() == (None, None, None)
    assert AmdSysfs(tmp_path / "nothing-here").read() == (None, None, None)


class _FixedGpu:
    def __init__(self, reading: tuple[float | None, float | None, float | None]) -> None:
        self.reading = reading

    def read(self) -> tuple[float | None, float | None, float | None]:
        return self.reading


class _BrokenGpu:
    def read(self) -> tuple[float | None, float | None, float | None]:
        raise RuntimeError("driver hiccup")


def test_portable_probes_combine_gpu_readers():
    readers: list[GpuReader] = [_FixedGpu((70, 0.2, 100)), _BrokenGpu(), _FixedGpu((80, None, 50))]
    reading = PortableProbes(gpu_readers=readers).read()
    assert (reading.gpu_temp_c, reading.gpu_utilization, reading.gpu_power_w) == (80.0, 0.2, 150)
    nothing = PortableProbes(gpu_readers=[_FixedGpu((None, None, None))]).read()
    assert (nothing.gpu_temp_c, nothing.gpu_utilization, nothing.gpu_power_w) == (None,) * 3


# ---- D-Bus: a private session bus and fake desktop services

_BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:dir={dir}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""

needs_dbus = pytest.mark.skipif(
    shutil.which("dbus-daemon") is None, reason="needs dbus-daemon for a private bus"
)


class _Bus:
    def __init__(self, proc: subprocess.Popen[str], address: str) -> None:
        self.proc = proc
        self.address = address

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)


@pytest.fixture
def bus() -> Iterator[_Bus]:
    # A short directory of our own: unix socket paths are limited to ~108 bytes.
    workdir = Path(tempfile.mkdtemp(prefix="moe-dbus-"))
    config = workdir / "bus.conf"
    config.write_text(_BUS_CONFIG.format(dir=workdir))
    with subprocess.Popen(
        ["dbus-daemon", f"--config-file={config}", "--print-address", "--nofork"],
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        bus = _Bus(proc, "")
        try:
            assert proc.stdout is not None
            bus.address = proc.stdout.readline().strip()  # printed once it listens
            assert bus.address.startswith("unix:"), bus.address
            yield bus
        finally:
            bus.kill()
            shutil.rmtree(workdir, ignore_errors=True)


class _FakeService:
    """Owns ``bus_name`` and answers ``interface.member`` at ``path`` with ``value`` (of D-Bus
    type ``signature``); every other call gets an UnknownMethod error, like a real service."""

    def __init__(
        self,
        address: str,
        bus_name: str,
        where: tuple[str, str, str],
        signature: str,
        value: object,
    ) -> None:
        self.conn: DBusConnection = open_dbus_connection(bus=address)
        (status,) = Proxy(message_bus, self.conn, timeout=2).RequestName(bus_name)
        assert status == 1  # DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER
        self.where = where
        self.signature = signature
        self.value = value
        self.calls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self.conn.receive(timeout=0.05)
            except TimeoutError:
                continue
            except OSError:
                return  # the bus went away
            if msg.header.message_type is not MessageType.method_call:
                continue
            fields = msg.header.fields
            asked = (
                fields.get(HeaderFields.path),
                fields.get(HeaderFields.interface),
                fields.get(HeaderFields.member),
            )
            self.calls += 1
            if asked == self.where and self.value is None:
                continue  # a hung desktop: no reply at all
            if asked == self.where:
                self.conn.send(new_method_return(msg, self.signature, (self.value,)))
            else:
                self.conn.send(new_error(msg, "org.freedesktop.DBus.Error.UnknownMethod"))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.conn.close()


@pytest.fixture
def services(bus: _Bus) -> Iterator[list[_FakeService]]:
    started: list[_FakeService] = []
    yield started
    for service in started:
        service.close()


def _gnome(bus: _Bus, idle_ms: int) -> _FakeService:
    return _FakeService(
        bus.address,
        "org.gnome.Mutter.IdleMonitor",
        ("/org/gnome/Mutter/IdleMonitor/Core", "org.gnome.Mutter.IdleMonitor", "GetIdletime"),
        "t",  # uint64 milliseconds
        idle_ms,
    )


def _kde(bus: _Bus, idle_ms: int) -> _FakeService:
    return _FakeService(
        bus.address,
        "org.freedesktop.ScreenSaver",
        ("/org/freedesktop/ScreenSaver", "org.freedesktop.ScreenSaver", "GetSessionIdleTime"),
        "u",  # uint32 milliseconds (kscreenlocker)
        idle_ms,
    )


@needs_dbus
def test_dbus_idle_from_gnome(bus: _Bus, services: list[_FakeService]):
    services.append(_gnome(bus, 123_456))
    idle = DbusIdle(bus.address)
    try:
        assert idle.idle_seconds() == pytest.approx(123.456)
        services[0].value = 5_000
        assert idle.idle_seconds() == pytest.approx(5.0)
    finally:
        idle.close()


@needs_dbus
def test_dbus_idle_from_kde_screensaver(bus: _Bus, services: list[_FakeService]):
    services.append(_kde(bus, 42_000))
    idle = DbusIdle(bus.address)
    try:
        assert idle.idle_seconds() == pytest.approx(42.0)
        # GNOME's monitor is not on this bus: not asked again for a while.
        assert idle.skipped == {"org.gnome.Mutter.IdleMonitor.GetIdletime"}
        assert idle.idle_seconds() == pytest.approx(42.0)
        assert services[0].calls == 2
    finally:
        idle.close()


@needs_dbus
def test_dbus_idle_wrong_method_is_given_up(bus: _Bus, services: list[_FakeService]):
    # The name is owned but the method is not there (KDE's NotSupported on Wayland alike).
    kde = _kde(bus, 1)
    kde.where = ("/elsewhere", "org.example", "Nothing")
    services.append(kde)
    idle = DbusIdle(bus.address, retry_interval=0)  # a name not there yet: asked every time
    try:
        assert idle.idle_seconds() is None
        assert idle.idle_seconds() is None
        assert kde.calls == 1  # a missing method: never again
        assert idle.skipped == {"org.freedesktop.ScreenSaver.GetSessionIdleTime"}
    finally:
        idle.close()


@needs_dbus
def test_dbus_idle_finds_a_desktop_that_starts_later(bus: _Bus, services: list[_FakeService]):
    idle = DbusIdle(bus.address, retry_interval=0.1)
    try:
        assert idle.idle_seconds() is None
        services.append(_gnome(bus, 2_000))
        assert idle.idle_seconds() is None  # not asked again at once
        time.sleep(0.15)
        assert idle.idle_seconds() == pytest.approx(2.0)
    finally:
        idle.close()


@needs_dbus
def test_dbus_idle_times_out_on_a_hung_desktop(bus: _Bus, services: list[_FakeService]):
    gnome = _gnome(bus, 0)
    gnome.value = None
    services.append(gnome)
    idle = DbusIdle(bus.address, call_timeout=0.2)
    try:
        start = time.monotonic()
        assert idle.idle_seconds() is None
        assert time.monotonic() - start < 1
        gnome.value = 3_000  # it recovers: asked again, and the late reply is ignored
        assert idle.idle_seconds() == pytest.approx(3.0)
    finally:
        idle.close()


def _count_calls(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    calls: list[int] = []
    original = getattr(owner, name)

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


@needs_dbus
def test_dbus_idle_none_when_nobody_answers(bus: _Bus, monkeypatch: pytest.MonkeyPatch):
    sent = _count_calls(monkeypatch, DBusConnection, "send_and_get_reply")
    idle = DbusIdle(bus.address)
    try:
        start = time.monotonic()
        assert idle.idle_seconds() is None
        assert time.monotonic() - start < 3
        assert len(idle.skipped) == 2
        asked = len(sent)
        assert idle.idle_seconds() is None
        assert len(sent) == asked  # nothing asked again
    finally:
        idle.close()


@needs_dbus
def test_dbus_idle_survives_the_bus_going_away(bus: _Bus, services: list[_FakeService]):
    services.append(_gnome(bus, 1_000))
    idle = DbusIdle(bus.address, retry_interval=30)
    try:
        assert idle.idle_seconds() == pytest.approx(1.0)
        bus.kill()
        assert idle.idle_seconds() is None
        start = time.monotonic()
        assert idle.idle_seconds() is None  # no reconnect attempt before 30 s
        assert time.monotonic() - start < 0.5
    finally:
        idle.close()


def test_dbus_idle_without_a_bus_tries_rarely(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    connects = _count_calls(monkeypatch, dbus_idle, "open_dbus_connection")
    idle = DbusIdle(f"unix:path={tmp_path}/no-bus-here")
    assert idle.idle_seconds() is None
    assert idle.idle_seconds() is None
    assert len(connects) == 1
    idle.close()
    assert DbusIdle("tcp:host=localhost,port=1").idle_seconds() is None  # unsupported transport


@needs_dbus
def test_linux_probes_use_dbus_idle_without_x11(
    bus: _Bus, services: list[_FakeService], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("DISPLAY", raising=False)
    services.append(_gnome(bus, 7_250))
    probes = LinuxProbes(dbus_address=bus.address, gpu_readers=[])
    try:
        assert probes.read().idle_seconds == pytest.approx(7.25)
    finally:
        probes.close()
