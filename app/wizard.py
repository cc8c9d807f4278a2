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
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
    QWizard,
    QWizardPage,
)

from app.background import Runner, run_in_thread
from app.limits import spin_range
from app.project_picker import ProjectPicker, error_label, show_problems
from core.control.invite import Invite
from core.control.limits import PreferenceLimits, preference_limits
from core.control.models import ProjectSummary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WizardActions:
    """What the wizard asks of the tray (the node's commands); the slow ones run through
    ``run`` (a worker thread in the app, at once in tests)."""

    # Projects announced in the swarm.
    list_projects: Callable[[], list[ProjectSummary]]
    # Find and verify an invite's project; ControlError (its words) when it is not found.
    find: Callable[[Invite], ProjectSummary]
    # Join the project of an invite; the problems that prevented it (empty: joined).
    join: Callable[[Invite], list[str]]
    # Leave the project (undoes a join when the volunteer goes back and skips).
    leave: Callable[[], list[str]]
    # Ask the node to measure this device; progress comes back through the benchmark page.
    start_benchmark: Callable[[], None]
    # Save preference changes; the problems that prevented it (empty: saved).
    apply_limits: Callable[[dict[str, Any]], list[str]]
    run: Runner = run_in_thread


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
            "open AI model together with other volunteers.</p>"
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
    """The project to help. Next joins it, once the node has found and shown it; the
    join runs in the background and moves the wizard on when it is done."""

    def __init__(self, actions: WizardActions, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._actions = actions
        self.setObjectName("projectPage")
        self.setTitle("Choose a project")
        self.setSubTitle(
            "A project is one model being trained. Paste the invite its owner gave you "
            "(a moehome:// link), or pick one announced in the swarm."
        )
        self.picker = ProjectPicker(actions.list_projects, actions.find, actions.run)
        self.picker.chosen_changed.connect(self._on_chosen_changed)
        self.skip_check = QCheckBox("Skip for now (I will choose a project later)")
        self.skip_check.setObjectName("skipProjectCheck")
        self.skip_check.toggled.connect(self._on_skip_toggled)
        self.error = error_label("projectError")
        self.joining = QLabel()
        self.joining.setObjectName("projectJoining")
        self.joining.hide()
        #: The project this wizard joined (a later Skip leaves it again).
        self.joined: str | None = None
        self._joining = False
        layout = QVBoxLayout(self)
        layout.addWidget(self.picker, 1)
        layout.addWidget(self.skip_check)
        layout.addWidget(self.joining)
        layout.addWidget(self.error)

    def initializePage(self) -> None:  # noqa: N802 (Qt's name)
        self.picker.refresh()

    def _on_chosen_changed(self) -> None:
        show_problems(self.error, [])
        self.completeChanged.emit()

    def _on_skip_toggled(self, skip: bool) -> None:
        self.picker.setEnabled(not skip)
        show_problems(self.error, [])
        self.completeChanged.emit()

    def isComplete(self) -> bool:  # noqa: N802 (Qt's name)
        if self._joining:
            return False
        return self.skip_check.isChecked() or self.picker.chosen is not None

    def validatePage(self) -> bool:  # noqa: N802 (Qt's name)
        if self.skip_check.isChecked():
            return self._undo_join()
        chosen = self.picker.chosen
        if chosen is None:
            return False
        invite, summary = chosen
        if self.joined == invite.project:
            return True
        answered: list[list[str]] = []
        later = False
        self._set_joining(f"Joining {summary.name or invite.project}\N{HORIZONTAL ELLIPSIS}")

        def done(problems: list[str]) -> None:
            self._set_joining("")
            show_problems(self.error, problems)
            if not problems:
                self.joined = invite.project
                log.info("joined project %s", invite.project)
            if not later:
                answered.append(problems)
            elif not problems and self.wizard() is not None:
                self.wizard().next()  # the answer came later: move on now

        def failed(exc: Exception) -> None:
            done([f"Could not join: {exc}"])

        self._actions.run(lambda: self._actions.join(invite), done, failed)
        if answered:  # answered at once
            return not answered[0]
        later = True
        return False

    def _set_joining(self, text: str) -> None:
        self._joining = bool(text)
        self.joining.setText(text)
        self.joining.setVisible(bool(text))
        self.picker.setEnabled(not text)
        self.completeChanged.emit()

    def _undo_join(self) -> bool:
        if self.joined is None:
            return True
        problems = self._actions.leave()
        show_problems(self.error, problems)
        if not problems:
            log.info("left project %s (skipped)", self.joined)
            self.joined = None
        return not problems


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
        self.result.setText("\n".join(benchmark_lines(figures)) or "Measured.")

    def benchmark_failed(self, message: str) -> None:
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.button.setEnabled(True)
        self.result.setText(f"The measurement failed: {message}")


def benchmark_lines(figures: dict[str, Any]) -> list[str]:
    """The benchmark's figures in words: a processor without a GPU said so, small speeds
    in GFLOPS (0.0 TFLOPS reads as "nothing")."""
    lines = []
    if figures.get("device_type") == "cpu":
        lines.append("No GPU found: the processor will be used (it does far less work).")
    if figures.get("device"):
        lines.append(f"Device: {figures['device']}")
    for dtype in ("fp32", "fp16", "bf16"):
        tflops = figures.get(f"matmul_tflops_{dtype}")
        if isinstance(tflops, int | float) and tflops > 0:
            speed = f"{tflops:.1f} TFLOPS" if tflops >= 1 else f"{tflops * 1000:.0f} GFLOPS"
            lines.append(f"{dtype}: {speed}")
    memory = figures.get("memory_total_gb")
    if isinstance(memory, int | float):
        lines.append(f"Memory: {memory:.1f} GB")
    return lines


class LimitsPage(QWizardPage):
    def __init__(self, actions: WizardActions, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._actions = actions
        self.setObjectName("limitsPage")
        self.setTitle("When may moehome work?")
        self.setSubTitle("You can change these at any time: Limits… in the tray's menu.")

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

        self.error = error_label("limitsError")

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
        show_problems(self.error, problems)
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
