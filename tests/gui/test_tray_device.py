"""The tray says what the node computes on, and shows in plain sight (a menu line with a
warning icon, the icon's tooltip, one notification, the dashboard) when a GPU is there that
the node cannot use. No node: the test feeds the tray statuses."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication, QLabel

from app.link import NodeLink
from app.tray import Tray, settings_at
from core.control.models import DeviceStatus, Status
from tests.gui.fakes import NoAutostart
from tests.screenshots import HISTORY

WARNING = (
    "your GPU is not used: install the GPU build (NVIDIA GeForce RTX 3060 found; "
    "this torch 2.13.0+cpu computes on the CPU only)"
)


def make_tray(tmp_path) -> Tray:
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    link = NodeLink(tmp_path / "data")  # never started
    return Tray(app, link, None, settings_at(tmp_path / "config"), NoAutostart(), ["x"])


def working(device: DeviceStatus) -> Status:
    return Status(state="working", reason="", experts={"a": 0}, device=device, pid=5)


def test_the_tray_says_cpu_and_warns_of_a_gpu_left_unused(qtbot, tmp_path, monkeypatch):
    tray = make_tray(tmp_path)
    device, warning = tray.find_action("deviceAction"), tray.find_action("deviceWarningAction")
    assert not device.isVisible()  # not running: nothing to say
    assert not warning.isVisible()

    with qtbot.waitSignal(tray.shown):
        tray._on_status(working(DeviceStatus(device="cpu", computes_on="CPU")))
    assert device.isVisible()
    assert device.text() == "Computing on: CPU"
    assert not warning.isVisible()
    assert tray.icon.toolTip() == "moehome — Working: serving 1 expert"
    assert tray.notifications == []

    with qtbot.waitSignal(tray.shown):
        tray._on_status(working(DeviceStatus(device="cpu", computes_on="CPU", warning=WARNING)))
    assert device.text() == "Computing on: CPU"
    assert warning.isVisible()
    assert warning.isEnabled()
    assert not warning.icon().isNull()
    assert warning.text().startswith("Your GPU is not used: install the GPU build")
    assert warning.toolTip() == "Y" + WARNING[1:]
    assert tray.icon.toolTip().splitlines() == [
        "moehome — Working: serving 1 expert",
        "Y" + WARNING[1:],
    ]
    assert tray.notifications == [("moehome computes on the CPU", "Y" + WARNING[1:])]
    # the node says it again and again: told once
    tray._on_status(working(DeviceStatus(device="cpu", computes_on="CPU", warning=WARNING)))
    assert len(tray.notifications) == 1

    # the dashboard says it whole
    monkeypatch.setattr(tray.link, "call", lambda action: HISTORY)
    warning.trigger()
    assert tray.dashboard is not None
    qtbot.addWidget(tray.dashboard)
    figure = tray.dashboard.findChild(QLabel, "figureDevice")
    assert figure is not None
    assert figure.text().splitlines() == ["CPU", "\N{WARNING SIGN} Y" + WARNING[1:] + "."]

    # the GPU build installed: its name, and the warning gone
    gpu = DeviceStatus(device="cuda:0", computes_on="NVIDIA GeForce RTX 3060 (CUDA)")
    with qtbot.waitSignal(tray.shown):
        tray._on_status(working(gpu))
    assert device.text() == "Computing on: NVIDIA GeForce RTX 3060 (CUDA)"
    assert not warning.isVisible()
    assert figure.text() == "NVIDIA GeForce RTX 3060 (CUDA)"

    with qtbot.waitSignal(tray.shown):
        tray._on_not_running("the node does not answer")
    assert not device.isVisible()
    assert not warning.isVisible()
