"""Which project to help, in the wizard and in Project…: an invite pasted (or handed over
on the tray's command line), or one of the projects announced in the swarm. Before anyone
says yes, the node finds the project's signed manifest and the picker shows what it is:
name, what it trains, the owner's key.

The invite's rule is the node's (core.control.invite); the look-up runs in the background
(a :data:`~app.background.Runner`), so the window stays alive while the node searches."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.background import Runner, run_in_thread
from core.control import NodeNotRunning
from core.control.invite import Invite, InviteError, parse_invite
from core.control.models import ProjectSummary

log = logging.getLogger(__name__)

ERROR_STYLE: Final = "color: #c53030;"
_KINDS: Final = {"ffn": "feed-forward", "swiglu": "SwiGLU (Mixtral-style)"}


def error_label(name: str) -> QLabel:
    label = QLabel()
    label.setObjectName(name)
    label.setStyleSheet(ERROR_STYLE)
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.PlainText)  # problems may quote user input
    label.hide()
    return label


def show_problems(label: QLabel, problems: list[str]) -> None:
    label.setText("\n".join(problems))
    label.setVisible(bool(problems))


def count(n: float) -> str:
    """1.2 M, 350 k, 42."""
    for size, unit in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0 ", " ")
    return f"{n:.0f}"


def summary_text(summary: ProjectSummary) -> str:
    """What a volunteer reads before joining (plain text)."""
    lines = [summary.name or summary.project]
    if summary.description:
        lines.append(summary.description)
    if summary.experts:
        kind = _KINDS.get(summary.expert_kind, summary.expert_kind or "")
        per = (
            f", {count(summary.expert_parameters)} parameters each"
            if summary.expert_parameters
            else ""
        )
        layers = summary.mixture_layers
        where = f" in {layers} layer{'s' if layers != 1 else ''}" if layers else ""
        lines.append(f"Trains: {summary.experts} {kind} experts{where}{per}".replace("  ", " "))
    if summary.owner:
        lines.append(f"Owner's key: {summary.owner}")
    lines.append(f"Project id: {summary.project}")
    return "\n".join(lines)


class ProjectPicker(QWidget):
    #: ``chosen`` changed (a project was found and shown, or the choice went away).
    chosen_changed = Signal()

    def __init__(
        self,
        list_projects: Callable[[], list[ProjectSummary]],
        find: Callable[[Invite], ProjectSummary],
        run: Runner = run_in_thread,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self._list_projects = list_projects
        self._find = find
        self._run = run
        #: The invite and what the node found behind it; None until a look-up succeeded.
        self.chosen: tuple[Invite, ProjectSummary] | None = None
        self._looking = 0  # the look-up whose answer counts (older ones are ignored)
        self._quiet = False

        self.invite_edit = QLineEdit()
        self.invite_edit.setObjectName("inviteEdit")
        self.invite_edit.setPlaceholderText("moehome://join/…  (or the project id)")
        self.invite_edit.setClearButtonEnabled(True)
        self.invite_edit.textChanged.connect(self._on_text_changed)
        self.invite_edit.returnPressed.connect(self.look_up)
        self.look_up_button = QPushButton("Look up")
        self.look_up_button.setObjectName("lookUpButton")
        self.look_up_button.setEnabled(False)
        self.look_up_button.clicked.connect(self.look_up)
        self.invite_error = error_label("inviteError")

        self.summary = QLabel()
        self.summary.setObjectName("projectSummary")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.PlainText)  # a manifest's words, as they are
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.summary.setStyleSheet("QLabel { border: 1px solid palette(mid); padding: 6px; }")
        # never squeezed below its words: the list below gives way instead (the owner's
        # key and the project id were cut off on first view, with no scroll bar)
        self.summary.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
        self.summary.hide()

        self.project_list = QListWidget()
        self.project_list.setObjectName("projectList")
        self.project_list.setMinimumHeight(60)
        # Selection, not the current item: focusing the list makes its first row current,
        # and that must not choose a project for the user.
        self.project_list.itemSelectionChanged.connect(self._on_item_chosen)
        self.list_status = QLabel()
        self.list_status.setObjectName("projectListStatus")
        self.list_status.setWordWrap(True)
        self.list_status.setTextFormat(Qt.TextFormat.PlainText)
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.setObjectName("projectRefreshButton")
        self.refresh_button.clicked.connect(self.refresh)

        paste_row = QHBoxLayout()
        paste_row.addWidget(self.invite_edit, 1)
        paste_row.addWidget(self.look_up_button)
        status_row = QHBoxLayout()
        status_row.addWidget(self.list_status, 1)
        status_row.addWidget(self.refresh_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel("Paste the invite you were given:"))
        layout.addLayout(paste_row)
        layout.addWidget(self.invite_error)
        layout.addWidget(self.summary)
        layout.addWidget(QLabel("Or pick a project announced in the swarm:"))
        layout.addWidget(self.project_list, 1)
        layout.addLayout(status_row)

    # ------------------------------------------------------------ what the user does

    def set_invite_text(self, text: str) -> None:
        """Fill in an invite that came from outside (a link on a web page, the tray's
        command line) without looking it up: a look-up makes the node contact the peers
        the invite names, which a web page must not be able to do without a click."""
        self._quiet = True
        try:
            self.invite_edit.setText(text.strip())
        finally:
            self._quiet = False
        self._looking += 1  # an answer to an earlier look-up no longer counts
        self._set_chosen(None)
        try:
            invite = parse_invite(text)
        except InviteError as exc:
            self.summary.hide()
            self.look_up_button.setEnabled(False)
            show_problems(self.invite_error, [_sentence(str(exc))])
            return
        show_problems(self.invite_error, [])
        n = len(invite.peers)
        self.summary.setText(
            "An invite from a link. Look up asks "
            + (f"the {n} peer{'s' if n != 1 else ''} it names" if n else "known peers")
            + " for the project, and shows it before anything is joined."
        )
        self._show_summary()
        self.look_up_button.setEnabled(True)

    def _show_summary(self) -> None:
        """Show the summary, and let the window grow to show all of it: a window keeps
        the size it opened with, and the words were squeezed under the list."""
        self.summary.show()
        QTimer.singleShot(0, self, self._fit_window)  # not after the picker is gone

    def _fit_window(self) -> None:
        window = self.window()
        wanted = max(window.sizeHint().height(), window.minimumSizeHint().height())
        if window.height() < wanted:
            window.resize(window.width(), wanted)

    def invite(self) -> Invite | None:
        try:
            return parse_invite(self.invite_edit.text())
        except InviteError:
            return None

    def look_up(self) -> None:
        """Ask the node to find and verify the project of the invite."""
        try:
            invite = parse_invite(self.invite_edit.text())
        except InviteError as exc:
            show_problems(self.invite_error, [_sentence(str(exc))])
            return
        self._looking += 1
        mine = self._looking
        self._set_chosen(None)
        self.look_up_button.setEnabled(False)
        self.summary.setText("Looking for the project\N{HORIZONTAL ELLIPSIS} (up to a minute)")
        self._show_summary()

        def found(summary: ProjectSummary) -> None:
            if mine == self._looking:
                self._set_chosen((invite, summary))
                # the invite's peers are known to the node now: an empty list (asked
                # before it knew anyone) may have projects to show
                if self.project_list.count() == 0 and self.refresh_button.isEnabled():
                    self.refresh()

        def failed(exc: Exception) -> None:
            if mine == self._looking:
                log.info("project %s not found: %s", invite.project, exc)
                self.summary.hide()
                self.look_up_button.setEnabled(True)
                show_problems(self.invite_error, [_sentence(in_words(exc))])

        self._run(lambda: self._find(invite), found, failed)

    def refresh(self) -> None:
        """Fill the list from the projects announced in the swarm."""
        self.project_list.clear()
        self.list_status.setText("Looking for projects\N{HORIZONTAL ELLIPSIS}")
        self.refresh_button.setEnabled(False)

        def listed(projects: list[ProjectSummary]) -> None:
            self.refresh_button.setEnabled(True)
            for project in projects:
                name = project.name or project.project
                text = name
                if project.description:
                    text += f" \N{EM DASH} {project.description[:80]}"
                item = QListWidgetItem(text)
                item.setData(Qt.ItemDataRole.UserRole, project)
                item.setToolTip(summary_text(project))
                self.project_list.addItem(item)
            self.list_status.setText(
                f"{len(projects)} project(s) announced right now."
                if projects
                else "No project is announced right now: paste an invite."
            )

        def failed(exc: Exception) -> None:
            log.warning("could not list projects: %s", exc)
            self.refresh_button.setEnabled(True)
            self.list_status.setText(f"Could not list the projects: {in_words(exc)}")

        self._run(self._list_projects, listed, failed)

    # ------------------------------------------------------------ inside

    def _on_item_chosen(self) -> None:
        chosen = self.project_list.selectedItems()
        if not chosen:
            return
        summary = chosen[0].data(Qt.ItemDataRole.UserRole)
        assert isinstance(summary, ProjectSummary)
        self._quiet = True
        try:
            self.invite_edit.setText(summary.project)
        finally:
            self._quiet = False
        self._looking += 1  # an answer to an earlier look-up no longer counts
        self._set_chosen((Invite(project=summary.project), summary))

    def _on_text_changed(self, text: str) -> None:
        if self._quiet:
            return
        self._looking += 1
        self._set_chosen(None)
        self.summary.hide()
        problem = ""
        if text.strip():
            try:
                parse_invite(text)
            except InviteError as exc:
                problem = _sentence(str(exc))
        show_problems(self.invite_error, [problem] if problem else [])
        self.look_up_button.setEnabled(bool(text.strip()) and not problem)
        if not problem and text.strip():
            self.look_up()  # a pasted invite is looked up at once

    def _set_chosen(self, chosen: tuple[Invite, ProjectSummary] | None) -> None:
        self.chosen = chosen
        if chosen is not None:
            show_problems(self.invite_error, [])
            self.summary.setText(summary_text(chosen[1]))
            self._show_summary()
            self.look_up_button.setEnabled(True)
        self.chosen_changed.emit()


def in_words(exc: Exception) -> str:
    """A failed command, for the volunteer (not the path of a control file)."""
    if isinstance(exc, NodeNotRunning):
        return "moehome's node is not running yet (the app starts it); try again in a moment"
    return str(exc)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith((".", "!", ")")) else ".")
