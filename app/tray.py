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

from PySide6.QtCore import QObject, QSettings, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QAction, QDesktopServices
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPushButton,
    QStyle,
    QSystemTrayIcon,
    QVBoxLayout,
    QWidget,
)

from app.autostart import Autostart, autostart_for_this_os
from app.background import Runner, run_in_thread
from app.dashboard import DashboardWindow, paused_text
from app.icons import state_icon
from app.limits import LimitsDialog
from app.link import NodeLink
from app.project_picker import ProjectPicker, error_label, show_problems
from app.single_instance import SHOW
from app.supervisor import NodeSupervisor
from app.wizard import FirstStartWizard, WizardActions
from core.control import ControlClient, ControlError
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
        return paused_text(reason)
    return f"{state.capitalize()}: {reason}" if reason else state.capitalize()


MENU_CHARACTERS: Final = 72


def menu_text(line: str, most: int = MENU_CHARACTERS) -> str:
    """``line`` cut at a word to at most ``most`` characters, an ellipsis saying so."""
    if len(line) <= most:
        return line
    cut = line[: most - 1]
    if line[most - 1] != " ":  # a word was cut: it goes whole
        cut = cut.rsplit(" ", 1)[0]
    cut = cut.rstrip(" :,;")
    return f"{cut}\N{HORIZONTAL ELLIPSIS}"


_REACH: Final[dict[str, str]] = {
    "direct": "reachable directly",
    "relayed": "reachable through a relay",
    "unreachable": "not reachable yet (see the advice)",
    "checking": "checking whether others can connect\N{HORIZONTAL ELLIPSIS}",
    "this computer only": "only this computer can connect",
    "off": "not listening",
}


def network_line(status: Status | None) -> str:
    """The menu's network line: how other computers reach this one ("" when the node
    does not say: not running, or an older node)."""
    if status is None or not status.network.reachability:
        return ""
    return f"Network: {_REACH.get(status.network.reach, status.network.reach)}"


def device_line(status: Status | None) -> str:
    """The menu's device line: what the node computes on ("" when the node does not say:
    not running, or an older node)."""
    if status is None or not status.device.computes_on:
        return ""
    return f"Computing on: {status.device.computes_on}"


def credit_line(status: Status | None) -> str:
    """The menu's credit line: what the project's aggregators signed this node earned
    ("" before their first statements, or when the node does not say)."""
    if status is None or status.credit.checked_at is None:
        return ""
    c = status.credit
    line = f"Credit: {c.today:,.0f} today, {c.total:,.0f} in all"
    if c.rank is not None:
        line += f", #{c.rank} of {c.ranked}"
    if c.aggregators < c.aggregators_listed:
        line += f" ({c.aggregators} of {c.aggregators_listed} aggregators answered)"
    return line


def capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


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
    """The project the node serves: join one (an invite, or one announced), or leave."""

    def __init__(
        self,
        link: NodeLink,
        current: Status | None,
        run: Runner = run_in_thread,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.link = link
        self._run = run
        self.setObjectName("projectDialog")
        self.setWindowTitle("moehome \N{EM DASH} project")
        self.resize(560, 480)
        layout = QVBoxLayout(self)
        name = "none" if current is None else current.project_name or current.project or "none"
        self.current = QLabel(f"Serving now: {name}")
        self.current.setObjectName("projectCurrent")
        self.current.setTextFormat(Qt.TextFormat.PlainText)
        layout.addWidget(self.current)
        self.picker = ProjectPicker(
            lambda: link.call(lambda c: c.projects()),
            lambda invite: link.call(lambda c: c.find_project(invite.project, invite.peers)),
            run,
        )
        self.picker.chosen_changed.connect(self._on_chosen_changed)
        layout.addWidget(self.picker, 1)
        self.error = error_label("projectError")
        layout.addWidget(self.error)
        buttons = QHBoxLayout()
        self.buttons: dict[str, QPushButton] = {}
        for text, name_, slot in (
            ("Join", "joinButton", self.join),
            ("Leave", "leaveButton", self.leave),
            ("Close", "closeButton", self.reject),
        ):
            button = QPushButton(text)
            button.setObjectName(name_)
            button.clicked.connect(slot)
            buttons.addWidget(button)
            self.buttons[name_] = button
        self.buttons["joinButton"].setEnabled(False)
        self.buttons["leaveButton"].setEnabled(current is not None and current.project is not None)
        layout.addLayout(buttons)

    def _on_chosen_changed(self) -> None:
        show_problems(self.error, [])
        self.buttons["joinButton"].setEnabled(self.picker.chosen is not None)

    def join(self) -> None:
        chosen = self.picker.chosen
        if chosen is None:
            return
        invite, _summary = chosen
        self.buttons["joinButton"].setEnabled(False)

        def done(problems: list[str]) -> None:
            if problems:
                self.buttons["joinButton"].setEnabled(True)
                show_problems(self.error, problems)
            else:
                self.accept()

        self._run(
            lambda: self.link.problems(lambda c: c.join(invite.project, invite.peers)),
            done,
            lambda exc: done([str(exc)]),
        )

    def leave(self) -> None:
        error = self.link.try_call(lambda c: c.leave())
        if error:
            show_problems(self.error, [error])
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
        self.project_dialog: ProjectDialog | None = None
        self._problems_told: set[str] = set()
        #: The device warnings told in a notification: once each while the tray runs.
        self._device_warnings_told: set[str] = set()
        self._pending_invite = ""
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
            supervisor.stopped.connect(self._on_node_stopped)
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
        # how other computers reach this one; the advice in its tooltip
        self.network_action = self._action("", "networkAction")
        self.network_action.setEnabled(False)
        # what the node computes on; below it, a GPU it cannot use, in plain sight (it
        # opens the dashboard, which says it whole)
        self.device_action = self._action("", "deviceAction")
        self.device_action.setEnabled(False)
        self.device_warning_action = self._action("", "deviceWarningAction", self.open_dashboard)
        # the credit the project's aggregators signed; its proof in the tooltip
        self.credit_action = self._action("", "creditAction")
        self.credit_action.setEnabled(False)
        self.device_warning_action.setIcon(
            QApplication.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxWarning)
        )
        self.menu.setToolTipsVisible(True)
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
        self._action("Project…", "projectAction", lambda: self.open_project())
        self._action("Show log…", "showLogAction", self.show_log)
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
        self.dashboard.show()  # first: a hidden dashboard is not worth a history
        self.dashboard.raise_()
        self._refresh_history()
        self._history_timer.start(60_000)

    def _refresh_history(self) -> None:
        if self.dashboard is None or not self.dashboard.isVisible():
            self._history_timer.stop()
            return
        try:
            history: History = self.link.call(lambda c: c.history(time.time() - 48 * 3600))
        except ControlError:
            return
        self.dashboard.update_history(history)

    def handle_message(self, text: str) -> None:
        """What the command line or another tray asked for: an invite is shown (in the
        wizard when it is open, else in Project…); anything else shows the dashboard. An
        invite that comes before the node answers (the tray just started it) waits for it."""
        if text == SHOW or not text.strip():
            self.open_dashboard()
        elif self.status is None:
            self._pending_invite = text
        elif self.wizard is not None and self.wizard.isVisible():
            self.wizard.project_page.picker.set_invite_text(text)
            self.wizard.raise_()
            self.wizard.activateWindow()
        else:
            self.open_project(text)

    def open_project(self, invite: str = "") -> None:
        """The project dialog; with ``invite`` (the tray's command line, another tray
        handing one over) filled in, looked up when the volunteer clicks (a look-up contacts
        the peers an invite names). Nothing is joined without a click."""
        if self.project_dialog is None or not self.project_dialog.isVisible():
            self.project_dialog = ProjectDialog(self.link, self.status)
            self.project_dialog.picker.refresh()
        if invite:
            self.project_dialog.picker.set_invite_text(invite)
        self.project_dialog.show()
        self.project_dialog.raise_()
        self.project_dialog.activateWindow()

    def first_start(self) -> None:
        """The wizard, once (until it is finished)."""
        if self.settings.value("first_start_done", False, type=bool):
            return
        link = self.link

        actions = WizardActions(
            list_projects=lambda: link.call(lambda c: c.projects()),
            find=lambda invite: link.call(lambda c: c.find_project(invite.project, invite.peers)),
            join=lambda invite: link.problems(lambda c: c.join(invite.project, invite.peers)),
            leave=lambda: link.problems(lambda c: c.leave()),
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
        first = self.status is None
        self.node_pid = status.pid
        self._show(status)
        if first:
            # the node answers (again): what waited for it
            if self._pending_invite:
                invite, self._pending_invite = self._pending_invite, ""
                self.handle_message(invite)
            self._refresh_history()

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
        until = status.snoozed_until if status is not None else None
        snoozed = until is not None and code == "snoozed"
        if snoozed and until is not None:  # one line, not "Paused: snoozed" and another
            line = f"Snoozed — {remaining(until, time.time())} left"
        warning = capitalized(status.device.warning) if status is not None else ""
        self.icon.setIcon(state_icon(state, code))
        self.icon.setToolTip(f"moehome — {line}" + (f"\n{warning}" if warning else ""))
        # a menu as wide as a long reason crosses the screen: cut, the whole in its tooltip
        self.status_action.setText(menu_text(line))
        self.status_action.setToolTip(line)
        network = network_line(status)
        self.network_action.setText(network)
        self.network_action.setToolTip(status.network.advice if status is not None else "")
        self.network_action.setVisible(bool(network))
        device = device_line(status)
        self.device_action.setText(device)
        self.device_action.setVisible(bool(device))
        credit = credit_line(status)
        self.credit_action.setText(credit)
        self.credit_action.setVisible(bool(credit))
        if credit and status is not None:
            self.credit_action.setToolTip(
                f"proof: {status.credit.proof} (check it anywhere: moehome credit verify)"
            )
        self.device_warning_action.setText(menu_text(warning))
        self.device_warning_action.setToolTip(warning)
        self.device_warning_action.setVisible(bool(warning))
        if warning and warning not in self._device_warnings_told:
            self._device_warnings_told.add(warning)
            self._notify("moehome computes on the CPU", warning)
        running = status is not None
        # also without a project: a pause is stored and must be undoable from the menu
        paused_by_user = running and code in ("paused", "snoozed")
        self.pause_action.setVisible(running and not paused_by_user)
        self.resume_action.setVisible(running and paused_by_user)
        self.snooze_menu.setEnabled(running)
        if self.dashboard is not None and self.dashboard.isVisible():
            self.dashboard.update_status(status)
        if state == "working":
            self._problems_told.clear()  # solved: say it again if it comes back
        self.shown.emit(status)

    def _on_events(self, events: list[Event]) -> None:
        if self.dashboard is not None:
            self.dashboard.add_events(events)
        for event in events:
            if isinstance(event, StateEvent) and event.reason_code in HOT:
                self._notify("moehome paused", f"Paused: {event.reason or 'too hot'}")
            elif isinstance(event, ErrorEvent) and event.message not in self._problems_told:
                # once per problem: a join retried every few minutes repeats it
                self._problems_told.add(event.message)
                self._notify(
                    "moehome cannot serve its project",
                    f"{event.message}. It keeps trying; Project\N{HORIZONTAL ELLIPSIS} in the "
                    "menu changes or leaves the project.",
                )
            elif isinstance(event, BenchmarkEvent) and self.wizard is not None:
                page = self.wizard.benchmark_page
                if event.what == "done":
                    page.benchmark_done(event.figures or {})
                else:
                    page.benchmark_progress(event.done, event.total, event.what)

    def _on_crash(self, code: int, delay: float) -> None:
        # one balloon per series of crashes (the first after a healthy run); a node that
        # cannot start would otherwise interrupt every few seconds
        if delay > 1.0:
            log.info("node stopped again (exit %s); restarting in %.0f s", code, delay)
            return
        how = (
            f"was stopped by a signal ({-code}: killed, or out of memory)"
            if code < 0
            else f"stopped unexpectedly (exit code {code})"
        )
        self._notify(
            "moehome restarted its node",
            f"The node {how} and was started again. "
            "If it keeps stopping, Show log\N{HORIZONTAL ELLIPSIS} in the menu says why.",
        )

    def node_log(self) -> Path:
        if self.supervisor is not None and self.supervisor.log_path is not None:
            return self.supervisor.log_path
        return self.link.data_dir / "node.log"

    def show_log(self) -> None:
        """The node's log in the system's text viewer."""
        path = self.node_log()
        if not path.exists():
            self._notify("moehome", f"The node has written no log yet ({path}).")
            return
        if not self.open_file(path):
            self._notify("moehome", f"Could not open the log; it is {path}")

    def open_file(self, path: Path) -> bool:
        return QDesktopServices.openUrl(QUrl.fromLocalFile(str(path)))

    def _on_node_stopped(self) -> None:
        """``moehome stop`` stopped the node: the tray has nothing left to do."""
        self._notify("moehome stopped", "The node was stopped (moehome stop); moehome quits.")
        self.quit()

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
