"""Tray pieces that need no node: state icons, start at login, the first-start wizard."""

from __future__ import annotations

import configparser
import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QLabel

from app import icons
from app.autostart import (
    RUN_KEY,
    MacLaunchAgent,
    WindowsRunKey,
    XdgAutostart,
    autostart_for_this_os,
    desktop_exec,
)
from app.background import run_now
from app.wizard import FirstStartWizard, WizardActions, benchmark_lines
from core.control.models import ProjectSummary

# ---------------------------------------------------------------------------- icons


@pytest.mark.parametrize(
    ("state", "reason", "name"),
    [
        ("working", "", "working"),
        ("working", "gpu_hot", "working"),
        ("starting", "", "working"),
        ("paused", "gpu_hot", "hot"),
        ("paused", "cpu_hot", "hot"),
        ("paused", "user_active", "paused"),
        ("paused", "", "paused"),
        ("no project", "", "no-project"),
        ("error", "", "error"),
        ("not running", "", "not-running"),
        ("exploded", "", "error"),
        ("", "", "error"),
    ],
)
def test_icon_name(state, reason, name):
    assert icons.icon_name(state, reason) == name


def _opaque_pixels(icon: QIcon, size: int) -> int:
    image = icon.pixmap(size, size).toImage()
    assert not image.isNull()
    return sum(
        1
        for y in range(image.height())
        for x in range(image.width())
        if image.pixelColor(x, y).alpha()
    )


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ("working", ""),
        ("paused", ""),
        ("paused", "gpu_hot"),
        ("no project", ""),
        ("error", ""),
        ("not running", ""),
    ],
)
def test_state_icons_render_at_tray_sizes(qtbot, state, reason):
    icon = icons.state_icon(state, reason)
    assert not icon.isNull()
    for size in (16, 64):
        # A state icon is a mark, not a dot: a good part of the square is drawn.
        assert _opaque_pixels(icon, size) > size * size // 4


def test_every_icon_name_has_a_file():
    for name in icons.ICON_NAMES:
        assert icons.icon_path(name).is_file(), name


def test_state_icon_is_cached(qtbot):
    assert icons.state_icon("working", "").cacheKey() == icons.state_icon("starting", "").cacheKey()


def test_assets_dir_override(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("MOEHOME_ASSETS", str(tmp_path))
    assert icons.assets_dir() == tmp_path
    with pytest.raises(RuntimeError, match=r"state-working\.svg"):
        icons.state_icon("working", "")
    (tmp_path / "state-error.svg").write_text("this is not an svg")
    with pytest.raises(RuntimeError, match=r"state-error\.svg"):
        icons.state_icon("error", "")


def test_assets_dir_default(monkeypatch):
    monkeypatch.delenv("MOEHOME_ASSETS", raising=False)
    assert (icons.assets_dir() / "moehome.svg").is_file()


# ------------------------------------------------------------------------ autostart


def _read_desktop(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read(path, encoding="utf-8")
    return parser["Desktop Entry"]


def _unescape_desktop_string(value: str) -> str:
    """The general string unescaping of the Desktop Entry spec."""
    out: list[str] = []
    i = 0
    while i < len(value):
        if value[i] == "\\" and i + 1 < len(value):
            escapes = {"s": " ", "n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
            out.append(escapes.get(value[i + 1], value[i + 1]))
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def _parse_exec(value: str) -> list[str]:
    """The Exec quoting rule, read the way the spec words it (shlex differs on \\$)."""
    text = _unescape_desktop_string(value)
    args: list[str] = []
    current: list[str] | None = None
    i = 0
    while i < len(text):
        c = text[i]
        if c == " ":
            if current is not None:
                args.append("".join(current))
            current = None
            i += 1
        elif c == '"':
            current = current if current is not None else []
            i += 1
            while text[i] != '"':
                if (text[i] == "\\" and text[i + 1] in '"`$\\') or text[i] == "%":
                    assert text[i] != "%" or text[i + 1] == "%", "a lone % is a field code"
                    i += 1
                current.append(text[i])
                i += 1
            i += 1
        elif c == "%":
            assert text[i + 1] == "%", "a lone % is a field code"
            current = [*(current or []), "%"]
            i += 2
        else:
            assert c not in "\"'\\<>~|&;$*?#()`", f"reserved {c!r} outside quotes"
            current = [*(current or []), c]
            i += 1
    if current is not None:
        args.append("".join(current))
    return args


def test_xdg_autostart_enable_disable(tmp_path):
    auto = XdgAutostart(config_home=tmp_path, icon="/opt/moehome/moehome.svg")
    assert not auto.enabled()
    command = ["/opt/my apps/moehome-tray", "--minimized"]
    auto.enable(command)
    assert auto.path == tmp_path / "autostart" / "moehome.desktop"
    entry = _read_desktop(auto.path)
    assert entry["Type"] == "Application"
    assert entry["Name"] == "moehome"
    assert entry["Terminal"] == "false"
    assert entry["X-GNOME-Autostart-enabled"] == "true"
    assert entry["Icon"] == "/opt/moehome/moehome.svg"
    assert entry["Comment"]
    assert entry["Exec"] == '"/opt/my apps/moehome-tray" --minimized'
    assert _parse_exec(entry["Exec"]) == command
    assert auto.enabled()
    assert not list(auto.path.parent.glob("*.tmp"))  # the atomic write cleaned up

    auto.disable()
    assert not auto.path.exists()
    assert not auto.enabled()
    auto.disable()  # already absent: fine


def test_xdg_autostart_default_icon(tmp_path, monkeypatch):
    monkeypatch.delenv("MOEHOME_ASSETS", raising=False)
    auto = XdgAutostart(config_home=tmp_path)
    auto.enable(["moehome-tray"])
    assert Path(_read_desktop(auto.path)["Icon"]).is_file()


def test_xdg_autostart_config_home_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert XdgAutostart().path == tmp_path / "cfg" / "autostart" / "moehome.desktop"


def test_xdg_autostart_switched_off_by_desktop(tmp_path):
    auto = XdgAutostart(config_home=tmp_path, icon="moehome")
    auto.enable(["moehome-tray"])
    text = auto.path.read_text().replace(
        "X-GNOME-Autostart-enabled=true", "X-GNOME-Autostart-enabled=false"
    )
    auto.path.write_text(text)
    assert not auto.enabled()


@pytest.mark.parametrize(
    "arg",
    [
        "plain",
        "with space",
        'quote"inside',
        "dollar$HOME",
        "back\\slash",
        "100%",
        "50% done",
        "new\nline",
        "~/home",
        "tick`x`",
        "semi;colon",
        "",
    ],
)
def test_desktop_exec_round_trips(arg):
    command = ["/usr/bin/moehome-tray", arg]
    assert _parse_exec(desktop_exec(command)) == command


def test_mac_launch_agent_enable_disable(tmp_path):
    auto = MacLaunchAgent(home=tmp_path)
    assert not auto.enabled()
    command = ["/Applications/moehome.app/Contents/MacOS/moehome tray", "--minimized"]
    auto.enable(command)
    assert auto.path == tmp_path / "Library" / "LaunchAgents" / "org.moehome.tray.plist"
    with auto.path.open("rb") as f:
        agent = plistlib.load(f)
    assert agent == {
        "Label": "org.moehome.tray",
        "ProgramArguments": command,
        "RunAtLoad": True,
        "ProcessType": "Interactive",
    }
    assert auto.enabled()
    auto.disable()
    assert not auto.path.exists()
    assert not auto.enabled()
    auto.disable()


def test_autostart_for_this_os():
    expected = {"win32": WindowsRunKey, "darwin": MacLaunchAgent}.get(sys.platform, XdgAutostart)
    assert isinstance(autostart_for_this_os(), expected)


@pytest.mark.skipif(sys.platform != "win32", reason="the Run key exists only on Windows")
def test_windows_run_key():
    if sys.platform != "win32":  # also tells mypy: the rest is Windows-only
        raise AssertionError("skipped elsewhere")
    import winreg

    auto = WindowsRunKey()
    was = auto.enabled()
    try:
        auto.enable([r"C:\Program Files\moehome\moehome-tray.exe", "--minimized"])
        assert auto.enabled()
        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
            value, _ = winreg.QueryValueEx(key, "moehome")
        assert value == '"C:\\Program Files\\moehome\\moehome-tray.exe" --minimized'
        auto.disable()
        assert not auto.enabled()
        auto.disable()
    finally:
        if not was:
            auto.disable()


# --------------------------------------------------------------------------- wizard


class FakeNode:
    """Records the wizard's calls; answers what each test sets. The project page has
    tests of its own (tests/gui/test_project_picker.py)."""

    def __init__(self) -> None:
        self.limit_problems: list[str] = []
        self.limits: list[dict[str, Any]] = []
        self.benchmarks = 0

    def start_benchmark(self) -> None:
        self.benchmarks += 1

    def apply_limits(self, changes: dict[str, Any]) -> list[str]:
        self.limits.append(changes)
        return self.limit_problems

    def actions(self) -> WizardActions:
        return WizardActions(
            list_projects=list,
            find=lambda invite: ProjectSummary(project=invite.project),
            join=lambda invite: [],
            leave=list,
            start_benchmark=self.start_benchmark,
            apply_limits=self.apply_limits,
            run=run_now,
        )


@pytest.fixture
def node():
    return FakeNode()


@pytest.fixture
def wizard(qtbot, node):
    w = FirstStartWizard(node.actions())
    qtbot.addWidget(w)
    w.show()
    return w


def _page(wizard: FirstStartWizard) -> str:
    return wizard.currentPage().objectName()


def test_wizard_pages_and_title(wizard):
    assert wizard.objectName() == "firstStartWizard"
    assert wizard.windowTitle() == "Welcome to moehome"
    assert _page(wizard) == "welcomePage"
    text = wizard.welcome_page.findChild(QLabel, "welcomeText").text()
    assert "never" in text
    assert "battery" in text


def test_benchmark_page(wizard, node):
    wizard.project_page.skip_check.setChecked(True)
    wizard.next()
    wizard.next()
    assert _page(wizard) == "benchmarkPage"
    page = wizard.benchmark_page
    assert page.isComplete()  # optional
    page.button.click()
    assert node.benchmarks == 1
    assert not page.button.isEnabled()
    page.benchmark_progress(1, 4, "matmul fp16")
    assert page.progress.maximum() == 4
    assert page.progress.value() == 1
    assert "matmul fp16" in page.result.text()
    page.benchmark_done(
        {
            "device": "NVIDIA GeForce RTX 4070",
            "matmul_tflops_fp32": 28.91,
            "matmul_tflops_bf16": None,
            "memory_total_gb": 12.48,
        }
    )
    text = page.result.text()
    assert "RTX 4070" in text
    assert "28.9 TFLOPS" in text
    assert "12.5 GB" in text
    assert "bf16" not in text
    assert page.button.isEnabled()
    wizard.next()
    assert _page(wizard) == "limitsPage"


def test_benchmark_page_complete_without_measuring(wizard, node):
    wizard.project_page.skip_check.setChecked(True)
    wizard.next()
    wizard.next()
    wizard.next()
    assert _page(wizard) == "limitsPage"
    assert node.benchmarks == 0


def _to_limits(wizard: FirstStartWizard) -> None:
    wizard.project_page.skip_check.setChecked(True)
    for _ in range(3):
        wizard.next()
    assert _page(wizard) == "limitsPage"


def test_limits_defaults_sent(wizard, node):
    _to_limits(wizard)
    assert wizard.validateCurrentPage()
    (changes,) = node.limits
    assert changes == {
        "idle_only": True,
        "idle_minutes": 3.0,
        "pause_above_c": 83.0,
        "resume_below_c": 75.0,
        "memory_cap_gb": None,
    }
    for key in ("idle_minutes", "pause_above_c", "resume_below_c"):
        assert type(changes[key]) is float


def test_limits_edited_and_problems_shown(wizard, node):
    _to_limits(wizard)
    page = wizard.limits_page
    page.idle_only.setChecked(False)
    assert not page.idle_minutes.isEnabled()
    page.temp_limit.setValue(78)
    page.memory_cap.setChecked(True)
    page.memory_cap_gb.setValue(6.5)
    node.limit_problems = ["memory_cap_gb: must be below 4096"]
    assert not wizard.validateCurrentPage()
    assert node.limits[-1] == {
        "idle_only": False,
        "idle_minutes": 3.0,
        "pause_above_c": 78.0,
        "resume_below_c": 70.0,
        "memory_cap_gb": 6.5,
    }
    assert type(node.limits[-1]["memory_cap_gb"]) is float
    assert "must be below" in page.error.text()
    assert page.error.isVisible()
    node.limit_problems = []
    assert wizard.validateCurrentPage()
    assert not page.error.isVisible()


@pytest.mark.parametrize(
    ("figures", "lines"),
    [
        (
            {"device": "x86_64", "device_type": "cpu", "matmul_tflops_fp32": 0.0412},
            [
                "No GPU found: the processor will be used (it does far less work).",
                "Device: x86_64",
                "fp32: 41 GFLOPS",
            ],
        ),
        (
            {"device": "RTX 4070", "device_type": "cuda", "matmul_tflops_fp16": 58.31},
            ["Device: RTX 4070", "fp16: 58.3 TFLOPS"],
        ),
        ({"matmul_tflops_fp32": 0.0, "matmul_tflops_bf16": None}, []),  # no "0.0 TFLOPS"
    ],
)
def test_benchmark_figures_in_words(figures, lines):
    assert benchmark_lines(figures) == lines


def test_the_desktop_entry_is_installed_on_a_fresh_account(tmp_path):
    """`moehome-tray --install-desktop-entry` from the unpacked bundle: the folders of a
    fresh account are created, the entry starts this tray and takes moehome:// links
    (registered: at 8609050 `gio mime x-scheme-handler/moehome` found no handler)."""
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(tmp_path / "share"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "QT_QPA_PLATFORM": "offscreen",
    }
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "mimeapps.list").write_text(
        "[Default Applications]\ntext/html=firefox.desktop\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "app.launcher", "--install-desktop-entry"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    path = tmp_path / "share" / "applications" / "moehome.desktop"
    assert str(path) in done.stdout
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path, encoding="utf-8")
    entry = parser["Desktop Entry"]
    # the menu starts the launcher, which starts the tray again after a crash
    assert entry["Exec"].startswith(desktop_exec([sys.executable, "-m", "app.launcher"]))
    assert entry["Exec"].endswith(" %u")  # an invite link clicked in a browser
    assert entry["MimeType"] == "x-scheme-handler/moehome;"
    assert Path(entry["Icon"]).is_file()
    mimeapps = configparser.ConfigParser(interpolation=None)
    mimeapps.read(tmp_path / "config" / "mimeapps.list", encoding="utf-8")
    assert mimeapps["Default Applications"]["x-scheme-handler/moehome"] == "moehome.desktop"
    assert mimeapps["Default Applications"]["text/html"] == "firefox.desktop"  # kept
    if shutil.which("gio"):  # what a browser asks, where the desktop has it
        said = subprocess.run(
            ["gio", "mime", "x-scheme-handler/moehome"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert "moehome.desktop" in said.stdout, said.stdout + said.stderr


def test_fatal_errors_of_a_tray_whose_stderr_goes_nowhere_are_kept(tmp_path):
    """Python writes a fatal error (none_dealloc) to file descriptor 2, not to
    faulthandler's file: a tray started from the desktop (stderr to /dev/null) keeps it in
    its crash log; one whose stderr is read (a terminal, a pipe) leaves stderr alone."""
    script = (
        "import os, sys; from pathlib import Path; from app.main import _keep_crash_traces; "
        f"_keep_crash_traces(Path({str(tmp_path / 'crash.log')!r})); "
        "os.write(2, b'Fatal Python error: none_dealloc\\n')"
    )
    argv = [sys.executable, "-c", script]
    subprocess.run(argv, stderr=subprocess.DEVNULL, check=True, timeout=60)
    assert "none_dealloc" in (tmp_path / "crash.log").read_text()
    (tmp_path / "crash.log").unlink()
    piped = subprocess.run(argv, stderr=subprocess.PIPE, check=True, timeout=60)
    assert b"none_dealloc" in piped.stderr
    assert "none_dealloc" not in (tmp_path / "crash.log").read_text()
