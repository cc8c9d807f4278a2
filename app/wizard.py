"""First start: what moehome does, which project to help, how fast this computer is, and
the few limits that matter most.

The wizard never talks to the node itself: the tray hands it callbacks
(:class:`WizardActions`) and pushes benchmark progress in through
:meth:`BenchmarkPage.benchmark_progress` and :meth:`BenchmarkPage.benchmark_done`. That
keeps it testable with fakes and keeps every network call in one place (the tray).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
    QWizard,
    QWizardPage,
)

from app.limits import spin_range
from core.control.limits import (
    PROJECT_ID_RULE,
    PreferenceLimits,
    is_project_id,
    normalize_project_id,
    preference_limits,
)
from core.control.models import ProjectSummary

log = logging.getLogger(__name__)

_ERROR_STYLE: Final = "color: #c53030;"


@dataclass(frozen=True)
class WizardActions:
    """What the wizard asks of the tray; each call may block briefly on the node."""

    # Projects announced in the swarm.
    list_projects: Callable[[], list[ProjectSummary]]
    # Join a project; the problems that prevented it (empty: joined).
    join: Callable[[str], list[str]]
    # Ask the node to measure this device; progress comes back through the benchmark page.
    start_benchmark: Callable[[], None]
    # Save preference changes; the problems that prevented it (empty: saved).
    apply_limits: Callable[[dict[str, Any]], list[str]]


def _error_label(name: str) -> QLabel:
    label = QLabel()
    label.setObjectName(name)
    label.setStyleSheet(_ERROR_STYLE)
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.PlainText)  # problems may quote user input
    label.hide()
    return label


def _show_problems(label: QLabel, problems: list[str]) -> None:
    label.setText("\n".join(problems))
    label.setVisible(bool(problems))


def pause_limit_range(limits: PreferenceLimits) -> tuple[int, int]:
    """The whole degrees the GPU pause limit may take on the limits page, where the resume
    temperature follows it (limit - ``resume_gap_c``): both must be in the node's ranges."""
    gap = limits.resume_gap_c
    resume = limits.ranges["resume_below_c"]
    # the pause limits whose resume temperature is in range: the resume range, shifted up
    shifted = resume.model_copy(update={"low": resume.low + gap, "high": resume.high + gap})
    pause_low, pause_high = spin_range(limits.ranges["pause_above_c"], 0)
    shifted_low, shifted_high = spin_range(shifted, 0)
    return int(max(pause_low, shifted_low)), int(min(pause_high, shifted_high))


class WelcomePage(QWizardPage):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("welcomePage")
        self.setTitle("Welcome to moehome")
        text = QLabel(
            "<p>While you are not using this computer, its graphics card helps train an "
            "open AI model together with thousands of other volunteers.</p>"
            "<p>moehome <b>pauses by itself</b> as soon as you come back, when the graphics "
            "card gets hot, and when the computer runs on battery.</p>"
            "<p><b>moehome will never:</b></p>"
            "<ul>"
            "<li>run code it gets from the network,</li>"
            "<li>read your files,</li>"
            "<li>use the graphics card while you play or work, unless you allow it,</li>"
            "<li>keep running after you quit it.</li>"
            "</ul>"
            "<p>The next pages take about a minute.</p>"
        )
        text.setObjectName("welcomeText")
        text.setTextFormat(Qt.TextFormat.RichText)
        text.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addWidget(text)
        layout.addStretch(1)


class ProjectPage(QWizardPage):
    def __init__(self, actions: WizardActions, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._actions = actions
        self.setObjectName("projectPage")
        self.setTitle("Choose a project")
        self.setSubTitle(
            "A project is one model being trained. Pick one below, or paste the id "
            "someone gave you."
        )

        self.project_list = QListWidget()
        self.project_list.setObjectName("projectList")
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

        self.id_edit = QLineEdit()
        self.id_edit.setObjectName("projectIdEdit")
        self.id_edit.setPlaceholderText(PROJECT_ID_RULE)
        self.id_edit.setClearButtonEnabled(True)
        self.id_edit.textChanged.connect(self._on_text_changed)

        self.skip_check = QCheckBox("Skip for now (I will choose a project later)")
        self.skip_check.setObjectName("skipProjectCheck")
        self.skip_check.toggled.connect(self._on_skip_toggled)

        self.error = _error_label("projectError")

        status_row = QHBoxLayout()
        status_row.addWidget(self.list_status, 1)
        status_row.addWidget(self.refresh_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.project_list, 1)
        layout.addLayout(status_row)
        layout.addWidget(QLabel("Project id:"))
        layout.addWidget(self.id_edit)
        layout.addWidget(self.skip_check)
        layout.addWidget(self.error)

    def initializePage(self) -> None:  # noqa: N802 (Qt's name)
        self.refresh()

    def refresh(self) -> None:
        """Fill the list from the projects announced in the swarm."""
        self.project_list.clear()
        try:
            projects = self._actions.list_projects()
        except Exception as exc:  # noqa: BLE001 (any failure: the paste field still works)
            log.warning("could not list projects: %s", exc)
            self.list_status.setText(f"could not list projects: {exc}")
            return
        for project in projects:
            name = project.name or project.project
            description = project.description
            item = QListWidgetItem(f"{name} \N{EM DASH} {description}" if description else name)
            item.setData(Qt.ItemDataRole.UserRole, project.project)
            item.setToolTip(project.project)
            self.project_list.addItem(item)
        if projects:
            self.list_status.setText(f"{len(projects)} project(s) announced right now.")
        else:
            self.list_status.setText(
                "No project is announced right now; you can paste an id or skip."
            )

    def _on_item_chosen(self) -> None:
        chosen = self.project_list.selectedItems()
        if chosen:
            self.id_edit.setText(str(chosen[0].data(Qt.ItemDataRole.UserRole)))

    def _on_text_changed(self, _text: str) -> None:
        _show_problems(self.error, [])
        self.completeChanged.emit()

    def _on_skip_toggled(self, skip: bool) -> None:
        for widget in (self.project_list, self.id_edit, self.refresh_button):
            widget.setEnabled(not skip)
        _show_problems(self.error, [])
        self.completeChanged.emit()

    def project_id(self) -> str:
        return normalize_project_id(self.id_edit.text())

    def isComplete(self) -> bool:  # noqa: N802 (Qt's name)
        return self.skip_check.isChecked() or is_project_id(self.project_id())

    def validatePage(self) -> bool:  # noqa: N802 (Qt's name)
        if self.skip_check.isChecked():
            return True
        project_id = self.project_id()
        if not is_project_id(project_id):
            _show_problems(self.error, [f"{PROJECT_ID_RULE[0].upper()}{PROJECT_ID_RULE[1:]}."])
            return False
        try:
            problems = self._actions.join(project_id)
        except Exception as exc:  # noqa: BLE001 (shown to the user, who can retry or skip)
            log.warning("could not join project %s: %s", project_id, exc)
            problems = [f"could not join: {exc}"]
        _show_problems(self.error, problems)
        if problems:
            return False
        log.info("joined project %s", project_id)
        return True


class BenchmarkPage(QWizardPage):
    def __init__(self, actions: WizardActions, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._actions = actions
        self.setObjectName("benchmarkPage")
        self.setTitle("Measure this computer")
        self.setSubTitle(
            "Optional: a short test (about a minute) tells moehome how much work to give this "
            "computer. You can also skip it; moehome measures later on its own."
        )

        self.button = QPushButton("Measure this computer")
        self.button.setObjectName("benchmarkButton")
        self.button.clicked.connect(self._start)

        self.progress = QProgressBar()
        self.progress.setObjectName("benchmarkProgress")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)

        self.result = QLabel()
        self.result.setObjectName("benchmarkResult")
        self.result.setWordWrap(True)
        self.result.setTextFormat(Qt.TextFormat.PlainText)

        layout = QVBoxLayout(self)
        layout.addWidget(self.button, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.progress)
        layout.addWidget(self.result)
        layout.addStretch(1)

    def _start(self) -> None:
        try:
            self._actions.start_benchmark()
        except Exception as exc:  # noqa: BLE001 (the page is optional: say so and go on)
            log.warning("could not start the benchmark: %s", exc)
            self.result.setText(f"could not start the measurement: {exc}")
            return
        self.button.setEnabled(False)
        # A busy bar until the node reports the first step.
        self.progress.setRange(0, 0)
        self.result.setText("Measuring\N{HORIZONTAL ELLIPSIS}")

    def benchmark_progress(self, done: int, total: int, what: str) -> None:
        """The node's progress report: ``done`` of ``total`` steps, now doing ``what``."""
        if total > 0:
            self.progress.setRange(0, total)
            self.progress.setValue(max(0, min(done, total)))
        else:
            self.progress.setRange(0, 0)
        self.result.setText(f"Measuring: {what}\N{HORIZONTAL ELLIPSIS}")

    def benchmark_done(self, figures: dict[str, Any]) -> None:
        """The figures of :func:`core.node.bench.run_benchmark` (missing keys are skipped)."""
        self.progress.setRange(0, 1)
        self.progress.setValue(1)
        self.button.setEnabled(True)
        self.button.setText("Measure again")
        lines = []
        if figures.get("device"):
            lines.append(f"Device: {figures['device']}")
        for dtype in ("fp32", "fp16", "bf16"):
            tflops = figures.get(f"matmul_tflops_{dtype}")
            if isinstance(tflops, int | float):
                lines.append(f"{dtype}: {tflops:.1f} TFLOPS")
        memory = figures.get("memory_total_gb")
        if isinstance(memory, int | float):
            lines.append(f"Memory: {memory:.1f} GB")
        self.result.setText("\n".join(lines) or "Measured.")

    def benchmark_failed(self, message: str) -> None:
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.button.setEnabled(True)
        self.result.setText(f"The measurement failed: {message}")


class LimitsPage(QWizardPage):
    def __init__(self, actions: WizardActions, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._actions = actions
        self.setObjectName("limitsPage")
        self.setTitle("When may moehome work?")
        self.setSubTitle("You can change these at any time in the settings.")

        # The node's defaults and ranges, read off its own model.
        limits = preference_limits()
        defaults = limits.defaults
        self._resume_gap_c = limits.resume_gap_c

        self.idle_only = QCheckBox("Only when I am away")
        self.idle_only.setObjectName("idleOnlyCheck")
        self.idle_only.setChecked(defaults["idle_only"])
        self.idle_minutes = QSpinBox()
        self.idle_minutes.setObjectName("idleMinutesSpin")
        low, high = spin_range(limits.ranges["idle_minutes"], 0)
        self.idle_minutes.setRange(int(low), int(high))
        self.idle_minutes.setValue(round(defaults["idle_minutes"]))
        self.idle_minutes.setSuffix(" min")
        self.idle_only.toggled.connect(self.idle_minutes.setEnabled)

        # The resume temperature follows the pause limit; both stay in the node's ranges.
        self.temp_limit = QSpinBox()
        self.temp_limit.setObjectName("tempLimitSpin")
        self.temp_limit.setRange(*pause_limit_range(limits))
        self.temp_limit.setValue(round(defaults["pause_above_c"]))
        self.resume_hint = QLabel()
        self.resume_hint.setObjectName("resumeHint")
        self.temp_limit.valueChanged.connect(self._update_resume_hint)
        self._update_resume_hint(self.temp_limit.value())

        self.memory_cap = QCheckBox("Use at most this much GPU memory")
        self.memory_cap.setObjectName("memoryCapCheck")
        self.memory_cap_gb = QDoubleSpinBox()
        self.memory_cap_gb.setObjectName("memoryCapSpin")
        self.memory_cap_gb.setDecimals(1)  # first: Qt rounds the range to the decimals
        self.memory_cap_gb.setRange(*spin_range(limits.ranges["memory_cap_gb"], 1))
        self.memory_cap_gb.setSingleStep(0.5)
        self.memory_cap_gb.setValue(4.0)  # a suggestion, once the box is ticked
        self.memory_cap_gb.setSuffix(" GB")
        self.memory_cap.setChecked(defaults["memory_cap_gb"] is not None)
        self.memory_cap_gb.setEnabled(self.memory_cap.isChecked())
        self.memory_cap.toggled.connect(self.memory_cap_gb.setEnabled)

        self.error = _error_label("limitsError")

        form = QFormLayout()
        form.addRow(self.idle_only)
        form.addRow("Start after I have been away for", self.idle_minutes)
        form.addRow("Pause when the GPU reaches (°C)", self.temp_limit)
        form.addRow("", self.resume_hint)
        form.addRow(self.memory_cap, self.memory_cap_gb)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addStretch(1)

    def _update_resume_hint(self, limit: int) -> None:
        resume = limit - self._resume_gap_c
        self.resume_hint.setText(f"It goes on once the GPU has cooled to {resume:g} °C.")

    def changes(self) -> dict[str, Any]:
        """The preference changes, with the node's names and types (floats, or None)."""
        limit = float(self.temp_limit.value())
        return {
            "idle_only": self.idle_only.isChecked(),
            "idle_minutes": float(self.idle_minutes.value()),
            "pause_above_c": limit,
            # The node's own gap: a resume temperature at the pause limit would flap.
            "resume_below_c": limit - self._resume_gap_c,
            "memory_cap_gb": (
                float(self.memory_cap_gb.value()) if self.memory_cap.isChecked() else None
            ),
        }

    def validatePage(self) -> bool:  # noqa: N802 (Qt's name)
        changes = self.changes()
        try:
            problems = self._actions.apply_limits(changes)
        except Exception as exc:  # noqa: BLE001 (shown to the user, who can retry)
            log.warning("could not save the limits: %s", exc)
            problems = [f"could not save the limits: {exc}"]
        _show_problems(self.error, problems)
        if problems:
            return False
        log.info("limits saved: %s", changes)
        return True


class FirstStartWizard(QWizard):
    """Shown by the tray on first start (and from its menu later)."""

    def __init__(self, actions: WizardActions, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("firstStartWizard")
        self.setWindowTitle("Welcome to moehome")
        self.setOption(QWizard.WizardOption.NoBackButtonOnStartPage, True)
        self.welcome_page = WelcomePage()
        self.project_page = ProjectPage(actions)
        self.benchmark_page = BenchmarkPage(actions)
        self.limits_page = LimitsPage(actions)
        for page in (self.welcome_page, self.project_page, self.benchmark_page, self.limits_page):
            self.addPage(page)
