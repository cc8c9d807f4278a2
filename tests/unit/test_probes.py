"""One conformance test for every probe backend this machine can run, the fake included."""

from __future__ import annotations

import psutil
import pytest

from core.node.probes import FakeProbes, Probes, Reading, probe_for_this_os


@pytest.fixture(params=["fake", "this_os"])
def probes(request) -> Probes:
    return FakeProbes() if request.param == "fake" else probe_for_this_os()


def test_probe_conformance(probes: Probes):
    reading = probes.read()
    assert isinstance(reading, Reading)
    assert reading.idle_seconds is None or reading.idle_seconds >= 0
    assert reading.gpu_temp_c is None or -50 < reading.gpu_temp_c < 150
    assert reading.cpu_temp_c is None or -50 < reading.cpu_temp_c < 150
    assert reading.on_battery in (None, True, False)
    assert reading.gpu_utilization is None or 0 <= reading.gpu_utilization <= 1
    assert all(name == name.lower() for name in reading.processes)


def test_the_real_probe_sees_this_test_running():
    names = probe_for_this_os().read().processes
    # this process by its own name ("python" under `python -m pytest`, "pytest" else)
    assert psutil.Process().name().lower() in names


def test_fake_probes_change_on_demand():
    fake = FakeProbes()
    fake.set(idle_seconds=5.0, gpu_temp_c=90.0)
    assert fake.read().idle_seconds == 5.0
    assert fake.read().gpu_temp_c == 90.0
    assert fake.reads == 2
