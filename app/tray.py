"""The tray: an icon whose look says the state, a menu with the status line and the
controls a volunteer reaches for (pause, snooze, limits), the windows behind it, and
notifications for the few things worth interrupting someone for."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from PySide6.QtCore import QObject, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QSystemTrayIcon,
    QVBoxLayout,
    QWidget,
)

from app.autostart import Autostart, autostart_for_this_os
from app.dashboard import DashboardWindow
from app.icons import state_icon
from app.limits import LimitsDialog
from app.link import NodeLink
from app.supervisor import NodeSupervisor
from app.wizard import FirstStartWizard, WizardActions
from core.control import ControlClient, ControlError
from core.control.limits import normalize_project_id
from core.control.models import BenchmarkEvent, ErrorEvent, Event, History, StateEvent, Status

log = logging.getLogger(__name__)

#: The icon's state while no node answers (the node itself never reports it).
NOT_RUNNING: Final = "not running"
HOT = ("gpu_hot", "cpu_hot")


def status_line(status: Status | None) -> str:
    """One line for the menu and the tooltip; ``None``: the node is not running."""
    if status is None:
        return "Node not running"
    state, reason = status.state, status.reason
    if state == "working":
        experts = len(status.experts)
        return f"Working: serving {experts} expert{'s' if experts != 1 else ''}"
    if state == "paused":
        return f"Paused: {reason}"
    return f"{state.capitalize()}: {reason}" if reason else state.capitalize()


def remaining(until: float, now: float) -> str:
    """'2 h 05 min' / '14 min' left of a snooze."""
    minutes = max(0, round((until - now) / 60))
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"


def seconds_until_tomorrow(now: dt.datetime, hour: int = 7) -> float:
    """Snooze 'until tomorrow': until 07:00 of the next day."""
    tomorrow = (now + dt.timedelta(days=1)).replace(hour=hour, minute=0, second=0, microsecond=0)
    return (tomorrow - now).total_seconds()


class ProjectDialog(QDialog):
    """The project the node serves: join one (pasted or announced), or leave."""

    def __init__(
        self, link: NodeLink, current: Status | None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.link = link
        self.setObjectName("projectDialog")
        self.setWindowTitle("moehome — project")
        layout = QVBoxLayout(self)
        name = "none" if current is None else current.project_name or current.project or "none"
        self.current = QLabel(f"Serving: {name}")
        self.current.setObjectName("projectCurrent")
        layout.addWidget(self.current)
        self.edit = QLineEdit()
        self.list = QListWidget()
        self.list.setObjectName("projectList")
        self.list.itemClicked.connect(
            lambda item: self.edit.setText(item.data(Qt.ItemDataRole.UserRole))
        )
        layout.addWidget(QLabel("Projects announced in the swarm:"))
        layout.addWidget(self.list)
        self.edit.setObjectName("projectIdEdit")
        self.edit.setPlaceholderText("or paste a project id")
        layout.addWidget(self.edit)
        self.error = QLabel()
        self.error.setObjectName("projectError")
        self.error.setStyleSheet("color: #c62828")
        self.error.setWordWrap(True)
        layout.addWidget(self.error)
        buttons = QHBoxLayout()
        for text, name_, slot in (
            ("Refresh", "refreshButton", self.refresh),
            ("Join", "joinButton", self.join),
            ("Leave", "leaveButton", self.leave),
            ("Close", "closeButton", self.reject),
        ):
            button = QPushButton(text)
            button.setObjectName(name_)
            button.clicked.connect(slot)
            buttons.addWidget(button)
        layout.addLayout(buttons)

    def refresh(self) -> None:
        self.list.clear()
        try:
            projects = self.link.call(lambda c: c.projects())
        except ControlError as exc:
            self.error.setText(f"could not list projects: {exc}")
            return
        for p in projects:
            item = QListWidgetItem(f"{p.name} — {p.description[:80]}")
            item.setData(Qt.ItemDataRole.UserRole, p.project)
            self.list.addItem(item)
        if not projects:
            self.error.setText("no project is announced in the swarm right now")

    def join(self) -> None:
        project = normalize_project_id(self.edit.text())
        problems = self.link.problems(lambda c: c.join(project))
        if problems:
            self.error.setText("\n".join(problems))
        else:
            self.accept()

    def leave(self) -> None:
        error = self.link.try_call(lambda c: c.leave())
        if error:
            self.error.setText(error)
        else:
            self.accept()


class Tray(QObject):
    #: Emitted after each status update is shown, with the Status (None: not running).
    shown = Signal(object)

    def __init__(
        self,
        app: QApplication,
        link: NodeLink,
        supervisor: NodeSupervisor | None,
        settings: QSettings,
        autostart: Autostart | None = None,
        tray_command: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.app = app
        self.link = link
        self.supervisor = supervisor
        self.settings = settings
        self.autostart = autostart or autostart_for_this_os()
        self.tray_command = tray_command or []
        #: The node's last status; None while it does not answer (``not_running_why``).
        self.status: Status | None = None
        self.not_running_why = "the node is not running"
        self.node_pid: int | None = None
        self.dashboard: DashboardWindow | None = None
        self.limits: LimitsDialog | None = None
        self.wizard: FirstStartWizard | None = None
        self.notifications: list[tuple[str, str]] = []  # (title, message), for tests too
        self.icon = QSystemTrayIcon(state_icon(NOT_RUNNING, ""), self)
        self.icon.setObjectName("tray")
        self.menu = self._build_menu()
        self.icon.setContextMenu(self.menu)
        self.icon.activated.connect(self._activated)
        link.status.connect(self._on_status)
        link.unreachable.connect(self._on_not_running)
        link.events.connect(self._on_events)
        if supervisor is not None:
            supervisor.crashed.connect(self._on_crash)
            supervisor.started.connect(lambda _pid: link.node_restarted())
        self._history_timer = QTimer(self)
        self._history_timer.timeout.connect(self._refresh_history)
        self._show(self.status)

    # ------------------------------------------------------------ menu

    def _action(self, text: str, name: str, slot: Any = None, menu: QMenu | None = None) -> QAction:
        action = QAction(text, menu or self.menu)
        action.setObjectName(name)
        if slot is not None:
            action.triggered.connect(slot)
        (menu or self.menu).addAction(action)
        return action

    def _build_menu(self) -> QMenu:
        self.menu = QMenu()
        self.menu.setObjectName("trayMenu")
        self.status_action = self._action("Node not running", "statusAction")
        self.status_action.setEnabled(False)
        self.reason_action = self._action("", "reasonAction")
        self.reason_action.setEnabled(False)
        self.menu.addSeparator()
        self.pause_action = self._action("Pause", "pauseAction", self.pause)
        self.resume_action = self._action("Resume", "resumeAction", self.resume)
        snooze = QMenu("Snooze", self.menu)
        snooze.setObjectName("snoozeMenu")
        self.snooze_menu = snooze
        self._action("For 1 hour", "snooze1hAction", lambda: self.snooze(3600), snooze)
        self._action("For 3 hours", "snooze3hAction", lambda: self.snooze(3 * 3600), snooze)
        self._action(
            "Until tomorrow",
            "snoozeTomorrowAction",
            lambda: self.snooze(seconds_until_tomorrow(dt.datetime.now())),
            snooze,
        )
        self.menu.addMenu(snooze)
        self.menu.addSeparator()
        self._action("Limits…", "limitsAction", self.open_limits)
        self._action("Dashboard…", "dashboardAction", self.open_dashboard)
        self._action("Project…", "projectAction", self.open_project)
        self.menu.addSeparator()
        self.login_action = self._action("Start at login", "startAtLoginAction")
        self.login_action.setCheckable(True)
        self.login_action.setChecked(self._autostart_enabled())
        self.login_action.toggled.connect(self.set_start_at_login)
        self._action("Quit", "quitAction", self.quit)
        return self.menu

    def find_action(self, name: str) -> QAction:
        for action in [*self.menu.actions(), *self.snooze_menu.actions()]:
            if action.objectName() == name:
                return action
        raise KeyError(name)

    # ------------------------------------------------------------ commands

    def pause(self) -> None:
        self._command(lambda c: c.pause())

    def resume(self) -> None:
        self._command(lambda c: c.resume())

    def snooze(self, seconds: float) -> None:
        self._command(lambda c: c.snooze(seconds))

    def _command(self, action: Callable[[ControlClient], Status]) -> None:
        try:
            self._show(self.link.call(action))
        except ControlError as exc:
            self._notify("moehome", f"The node did not take the command: {exc}")

    def set_start_at_login(self, enabled: bool) -> None:
        try:
            if enabled:
                self.autostart.enable(self.tray_command)
            else:
                self.autostart.disable()
        except OSError as exc:
            self._notify("moehome", f"Could not change start at login: {exc}")
            self.login_action.blockSignals(True)
            self.login_action.setChecked(not enabled)
            self.login_action.blockSignals(False)

    def _autostart_enabled(self) -> bool:
        try:
            return self.autostart.enabled()
        except OSError:
            return False

    def quit(self) -> None:
        """Stop the node cleanly (if we started it), then leave."""
        self.link.stop()
        if self.supervisor is not None:

            def ask() -> None:
                self.link.call(lambda c: c.shutdown())

            self.supervisor.stop(ask_nicely=ask)
        self.icon.hide()
        self.app.quit()

    # ------------------------------------------------------------ windows

    def open_limits(self) -> None:
        try:
            prefs = self.link.call(lambda c: c.preferences())
        except ControlError as exc:
            self._notify("moehome", f"The node is not running: {exc}")
            return
        self.limits = LimitsDialog(prefs, self._apply_preferences)
        self.limits.show()
        self.limits.raise_()

    def _apply_preferences(self, changes: dict[str, Any]) -> list[str]:
        return self.link.problems(lambda c: c.set_preferences(changes), "preferences: ")

    def open_dashboard(self) -> None:
        if self.dashboard is None:
            self.dashboard = DashboardWindow()
        self.dashboard.update_status(self.status)
        self._refresh_history()
        self._history_timer.start(60_000)
        self.dashboard.show()
        self.dashboard.raise_()

    def _refresh_history(self) -> None:
        if self.dashboard is None or not self.dashboard.isVisible():
            self._history_timer.stop()
            return
        try:
            history: History = self.link.call(lambda c: c.history(time.time() - 48 * 3600))
        except ControlError:
            return
        self.dashboard.update_history(history)

    def open_project(self) -> None:
        dialog = ProjectDialog(self.link, self.status)
        dialog.refresh()
        dialog.exec()

    def first_start(self) -> None:
        """The wizard, once (until it is finished)."""
        if self.settings.value("first_start_done", False, type=bool):
            return
        link = self.link

        actions = WizardActions(
            list_projects=lambda: link.call(lambda c: c.projects()),
            join=lambda project: link.problems(lambda c: c.join(project)),
            start_benchmark=lambda: link.call(lambda c: c.benchmark()),
            apply_limits=self._apply_preferences,
        )
        self.wizard = FirstStartWizard(actions)
        self.wizard.finished.connect(self._wizard_finished)
        self.wizard.show()

    def _wizard_finished(self, result: int) -> None:
        if result == QDialog.DialogCode.Accepted:
            self.settings.setValue("first_start_done", True)
            self.settings.sync()

    # ------------------------------------------------------------ what the node says

    def _on_status(self, status: Status) -> None:
        if self.node_pid is not None and status.pid != self.node_pid:
            self.link.node_restarted()  # its events are numbered from 1 again
        self.node_pid = status.pid
        self._show(status)

    def _on_not_running(self, why: str) -> None:
        if self.status is not None:
            log.info("node not answering: %s", why)
        self.not_running_why = why
        self._show(None)

    def _show(self, status: Status | None) -> None:
        self.status = status
        state = status.state if status is not None else NOT_RUNNING
        code = status.reason_code if status is not None else ""
        line = status_line(status)
        self.icon.setIcon(state_icon(state, code))
        self.icon.setToolTip(f"moehome — {line}")
        self.status_action.setText(line)
        until = status.snoozed_until if status is not None else None
        snoozed = until is not None and state == "paused" and code == "snoozed"
        self.reason_action.setText(
            f"Snoozed — {remaining(until, time.time())} left"
            if snoozed and until is not None
            else ""
        )
        self.reason_action.setVisible(snoozed)
        running = status is not None
        paused_by_user = state == "paused" and code in ("paused", "snoozed")
        self.pause_action.setVisible(running and not paused_by_user)
        self.resume_action.setVisible(running and paused_by_user)
        self.snooze_menu.setEnabled(running)
        if self.dashboard is not None and self.dashboard.isVisible():
            self.dashboard.update_status(status)
        self.shown.emit(status)

    def _on_events(self, events: list[Event]) -> None:
        if self.dashboard is not None:
            self.dashboard.add_events(events)
        for event in events:
            if isinstance(event, StateEvent) and event.reason_code in HOT:
                self._notify("moehome paused", f"Paused: {event.reason or 'too hot'}")
            elif isinstance(event, ErrorEvent):
                self._notify("moehome", f"Cannot serve the project: {event.message}")
            elif isinstance(event, BenchmarkEvent) and self.wizard is not None:
                page = self.wizard.benchmark_page
                if event.what == "done":
                    page.benchmark_done(event.figures or {})
                else:
                    page.benchmark_progress(event.done, event.total, event.what)

    def _on_crash(self, code: int, delay: float) -> None:
        self._notify(
            "moehome restarted its node",
            f"The node stopped unexpectedly (exit code {code}); restarting in {delay:.0f} s.",
        )

    def _notify(self, title: str, message: str) -> None:
        self.notifications.append((title, message))
        log.info("%s: %s", title, message)
        if QSystemTrayIcon.supportsMessages() and self.icon.isVisible():
            self.icon.showMessage(title, message, QSystemTrayIcon.MessageIcon.Information, 10_000)

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason == QSystemTrayIcon.ActivationReason.Trigger:
            self.open_dashboard()


def settings_at(config_dir: Path) -> QSettings:
    return QSettings(str(config_dir / "tray.ini"), QSettings.Format.IniFormat)
