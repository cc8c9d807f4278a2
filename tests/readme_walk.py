"""The README's owner section, run as its owner would: each line in its own process in
one folder (the owner's computer), filling in what earlier lines printed (the bootstrap
address, the project id). Used by tests/processes/test_readme_owner.py and
benchmarks/owner_path.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.waiting import until

ROOT = Path(__file__).resolve().parents[1]
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
        if "<bootstrap address>" in self.values:  # the README says both
            self.values.setdefault("<address>", self.values["<bootstrap address>"])
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
        with stderr.open("w") as log:  # the child holds its own copy
            proc = subprocess.Popen(
                argv, cwd=self.home, env=env, stdout=subprocess.PIPE, stderr=log, text=True
            )
        role = Running(name, proc, stderr)
        assert proc.stdout is not None
        threading.Thread(target=role.read, args=(proc.stdout,), daemon=True).start()
        self.running.append(role)
        self._wait_until_ready(command_words(command), role)
        return role

    def _wait_until_ready(self, words: list[str], role: Running) -> None:
        """What the owner waits for before the next line, and what it notes of it: the
        bootstrap peer's address, the project id."""
        if words == ["peer"]:
            self.values["<bootstrap address>"] = self.wait_for(role, "/ip4/", 60)
        elif words[:2] == ["owner", "publish"]:
            self.wait_for(role, "invite:", 120)
            self.values["<project id>"] = str(role.first("project id:")).split()[-1]
        elif words[:2] == ["aggregator", "run"]:
            self.wait_for(role, "/ip4/", 120)

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


def is_long_running(words: list[str]) -> bool:
    return any(tuple(words[: len(w)]) == w for w in LONG_RUNNING)


def command_words(command: str) -> list[str]:
    """The words after ``moehome``, up to the first placeholder."""
    return shlex.split(command.split("moehome", 1)[1].split("<")[0])
