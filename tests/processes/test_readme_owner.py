"""The README's owner section is a contract: its commands, run as written, one process
each on one computer (fresh folders, the template's defaults, no test hooks), publish a
project, announce it, aggregate, move every expert's version, train without a single
ban, and serve ``owner status``. When the README changes, this test runs the new text.

At 8609050 the same walk failed at the first long-running role: every role shared one
key, so the publisher refused to dial the bootstrap peer (itself) and the aggregator
found no provider of the weights but itself."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from tests.child_processes import stop_processes
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]
MOEHOME = [sys.executable, "-m", "core.cli"]
#: The commands that keep running (the README says so in their comments).
LONG_RUNNING = (
    ("peer",),
    ("owner", "publish"),
    ("aggregator", "run"),
    ("node",),
    ("owner", "train"),
)


def readme_blocks(heading: str) -> list[list[tuple[str, str]]]:
    """The ``sh`` blocks of a README section: per line, the command and its comment."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"### {heading}\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    out = []
    for block in blocks:
        lines = []
        for line in block.splitlines():
            command, _, comment = line.partition("  #")
            if command.strip():
                lines.append((command.strip(), comment.strip()))
        out.append(lines)
    return out


@dataclass
class Running:
    name: str
    proc: subprocess.Popen[str]
    stderr: Path
    lines: list[str] = field(default_factory=list)

    def read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def first(self, prefix: str) -> str | None:
        return next((line for line in self.lines if line.startswith(prefix)), None)

    def errors(self) -> list[str]:
        return [
            line
            for line in self.stderr.read_text(errors="replace").splitlines()
            if "Traceback" in line or " ERROR " in line or "banning" in line
        ]


class OwnerWalk:
    """Runs README lines in ``home`` as its owner would, filling in what earlier
    commands printed (the bootstrap address, the project id)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {
            **os.environ,
            "MOEHOME_DATA_DIR": str(home / "data"),
            "MOEHOME_CONFIG_DIR": str(home / "config"),
            # what `owner init --passphrase` and `owner publish` would prompt for
            "MOEHOME_OWNER_PASSPHRASE": "a passphrase the owner chose",
            "PYTHONPATH": str(ROOT),
        }
        self.values: dict[str, str] = {}
        self.running: list[Running] = []

    def argv(self, command: str) -> tuple[list[str], dict[str, str]]:
        for placeholder, value in self.values.items():
            command = command.replace(placeholder, value)
        assert "<" not in command, f"a placeholder the walk cannot fill: {command}"
        words = shlex.split(command)
        env = dict(self.env)
        while "=" in words[0]:
            name, _, value = words.pop(0).partition("=")
            env[name] = str(self.home / value)
        assert words[0] == "moehome", command
        return [*MOEHOME, *words[1:]], env

    def run(self, command: str) -> str:
        argv, env = self.argv(command)
        done = subprocess.run(
            argv, cwd=self.home, env=env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, f"{command}: {done.returncode}\n{done.stderr[-3000:]}"
        return done.stdout

    def start(self, command: str) -> Running:
        argv, env = self.argv(command)
        name = f"{len(self.running)}-{'-'.join(argv[3:5])}"
        stderr = self.home / f"{name}.log"
        proc = subprocess.Popen(
            argv,
            cwd=self.home,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr.open("w"),
            text=True,
        )
        role = Running(name, proc, stderr)
        assert proc.stdout is not None
        threading.Thread(target=role.read, args=(proc.stdout,), daemon=True).start()
        self.running.append(role)
        return role

    def wait_for(self, role: Running, prefix: str, timeout: float) -> str:
        """The first line ``role`` printed that starts with ``prefix``, once it did."""
        until(
            lambda: self.alive(role) and role.first(prefix),
            timeout,
            f"{role.name} printed no line starting with {prefix!r}",
        )
        return str(role.first(prefix))

    def alive(self, role: Running) -> bool:
        assert role.proc.poll() is None, (
            f"{role.name} exited with {role.proc.returncode}:\n"
            + role.stderr.read_text(errors="replace")[-3000:]
        )
        return True


def versions(status: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for agg in status["aggregators"]:
        out.update(agg.get("versions", {}))
    return out


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_the_readme_owner_section_runs_as_written(tmp_path: Path) -> None:
    walk_blocks = readme_blocks("For project owners")
    walk, more = walk_blocks[0], walk_blocks[1]
    home = tmp_path / "owner"
    home.mkdir()
    owner = OwnerWalk(home)
    trainer: Running | None = None
    try:
        for command, _comment in walk:
            words = shlex.split(command.split("moehome", 1)[1].split("<")[0])
            if not any(tuple(words[: len(w)]) == w for w in LONG_RUNNING):
                printed = owner.run(command)
                if words[:2] == ["owner", "status"]:
                    assert "experts covered:" in printed, printed
                continue
            role = owner.start(command)
            if words == ["peer"]:
                owner.wait_for(role, "/ip4/", 60)
                owner.values["<bootstrap address>"] = owner.values["<address>"] = str(
                    role.first("/ip4/")
                )
            elif words[:2] == ["owner", "publish"]:
                until(
                    lambda role=role: owner.alive(role) and role.first("invite:"), 120, "no invite"
                )
                owner.values["<project id>"] = str(role.first("project id:")).split()[-1]
                assert "moehome://join/" in str(role.first("invite:"))
            elif words[:2] == ["aggregator", "run"]:
                until(
                    lambda role=role: owner.alive(role) and role.first("/ip4/"),
                    120,
                    "no aggregator",
                )
            elif words[:2] == ["owner", "train"]:
                trainer = role
        assert trainer is not None, "the README's walk trains"
        status_json = next(c for c, _ in more if c.endswith("--json"))
        experts_total = 0

        def every_version_moved() -> bool:
            nonlocal experts_total
            for role in owner.running:
                if role is not trainer:
                    owner.alive(role)
            status = json.loads(owner.run(status_json))
            experts_total = status["experts_total"]
            moved = versions(status)
            return len(moved) == experts_total and min(moved.values()) >= 1

        until(every_version_moved, 420, "every expert's version moved", step=10)
        status = json.loads(owner.run(status_json))
        assert status["experts_covered"] == experts_total
        assert all(agg["banned_peers"] == 0 for agg in status["aggregators"]), status
        assert status["experts_waiting"] == "", status["experts_waiting"]
        # Ctrl-C: the trainer evaluates, checkpoints, reports and exits cleanly
        if trainer.proc.poll() is None:
            trainer.proc.send_signal(signal.SIGINT)
        assert trainer.proc.wait(timeout=180) == 0, trainer.stderr.read_text()[-3000:]
        assert (home / "data" / "trainer" / owner.values["<project id>"]).is_dir()
        for role in owner.running:
            assert role.errors() == [], f"{role.name}: {role.errors()[:5]}"
    finally:
        for role in owner.running:
            if role.proc.poll() is None:
                role.proc.send_signal(signal.SIGINT)
        try:
            for role in owner.running:
                role.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        stop_processes(role.proc for role in owner.running)
