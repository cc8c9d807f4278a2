from __future__ import annotations

import logging
import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from core.cli import app
from core.cli.volunteer import NOT_RUNNING, state_line
from core.control.files import write_address, write_token
from core.control.models import Status

runner = CliRunner()


def test_help_lists_the_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("id", "peer", "demo", "dht"):
        assert command in result.output


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("moehome ")


def test_id_creates_the_identity_once(tmp_path):
    first = runner.invoke(app, ["--data-dir", str(tmp_path), "id"])
    second = runner.invoke(app, ["--data-dir", str(tmp_path), "id"])
    assert first.exit_code == 0
    ids = [
        [line for line in r.output.splitlines() if line.startswith("peer id:")]
        for r in (first, second)
    ]
    assert len(ids[0]) == 1
    assert ids[0] == ids[1]
    assert (tmp_path / "identity.key").exists()


def test_corrupt_identity_is_reported_and_kept(tmp_path):
    (tmp_path / "identity.key").write_text("garbage")
    result = runner.invoke(app, ["--data-dir", str(tmp_path), "id"])
    assert result.exit_code == 2
    assert "corrupt" in result.output
    assert (tmp_path / "identity.key").read_text() == "garbage"


def test_dht_get_without_bootstrap_is_a_clear_error():
    result = runner.invoke(app, ["dht", "get", "/moehome/demo/x"])
    assert result.exit_code == 1
    assert "--bootstrap" in result.output


def test_libp2p_logs_reach_the_program_log():
    import net  # noqa: F401 - importing net reconnects libp2p's logger

    assert logging.getLogger("libp2p").propagate is True
    assert logging.getLogger("libp2p.network.auto_connector").level == logging.NOTSET


def test_errors_inside_exception_groups_become_one_line_errors():
    import trio

    from core.cli.common import run_async
    from net import DhtError

    async def fails_in_a_nursery():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 0)
            raise DhtError("none of 1 bootstrap peers answered")

    import pytest
    import typer

    with pytest.raises(typer.Exit) as info:
        run_async(fails_in_a_nursery)
    assert info.value.exit_code == 1


def test_node_selftest_checks_device_libp2p_and_an_expert(tmp_path, monkeypatch):
    monkeypatch.setenv("MOEHOME_DATA_DIR", str(tmp_path))
    result = runner.invoke(app, ["node", "--selftest"])
    assert result.exit_code == 0, result.output
    checks = (
        "compute device",
        "device benchmark",
        "libp2p hosts",
        "expert forward",
        "probes",
        "training text",
    )
    for check in checks:
        assert f"ok   {check}:" in result.output
    assert result.output.rstrip().endswith("node selftest: ok")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["demo", "--attack", "nonsense"], "--attack must be one of sign-flip, alie"),
        (["demo", "--slow", "5", "--volunteers", "4"], "--slow cannot exceed --volunteers"),
        (["demo", "--rule", "avg"], "--rule must be one of"),
        (["demo", "--trainer-optimizer", "lion"], "--trainer-optimizer lion: adamw or muon"),
        (["node", "--attack", "nonsense"], "--attack must be one of"),
    ],
)
def test_demo_and_node_refuse_bad_options_before_starting_anything(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


NODE_COMMANDS = [
    ["status"],
    ["status", "--json"],
    ["pause"],
    ["resume"],
    ["snooze", "30m"],
    ["join", "0f" * 16],
    ["leave"],
    ["stop"],
    ["prefs"],
    ["prefs", "idle_minutes=5"],
]


@pytest.mark.parametrize("stale", [False, True], ids=["never-started", "quit-left-files"])
@pytest.mark.parametrize("command", NODE_COMMANDS, ids=" ".join)
def test_every_node_command_without_a_node_is_one_line_with_what_to_do(tmp_path, command, stale):
    if stale:  # the files of a node that was killed (a tray that quit leaves none)
        write_address(tmp_path, f"http://127.0.0.1:{_closed_port()}", pid=1)
        write_token(tmp_path)
    result = runner.invoke(app, ["--data-dir", str(tmp_path), *command])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # not an exception that escaped
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == NOT_RUNNING, result.stderr
    assert len([line for line in lines if line.startswith("error:")]) == 1


def test_a_stopped_node_never_prints_a_traceback_from_a_real_process(tmp_path):
    write_address(tmp_path, f"http://127.0.0.1:{_closed_port()}", pid=1)
    write_token(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "core.cli", "--data-dir", str(tmp_path), "pause"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == NOT_RUNNING
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("invite", "says"),
    [("hello", "neither an invite nor a project id"), ("https://x/y", "not a moehome invite")],
)
def test_join_refuses_what_is_no_invite_before_asking_the_node(tmp_path, invite, says):
    result = runner.invoke(app, ["--data-dir", str(tmp_path), "join", invite])
    assert result.exit_code == 2
    assert says in result.stderr


@pytest.mark.parametrize("flag", ["--symmetric", "--kill-relay"])
def test_demo_nat_variations_need_nat(flag):
    result = runner.invoke(app, ["demo", flag])
    assert result.exit_code == 2
    assert "go with --nat" in result.output


def test_the_demo_commands_defaults_are_the_demo_options():
    """`moehome demo` with no option runs DemoOptions' defaults (the two are written
    apart: the command imports the demo only when it runs)."""
    import inspect

    from core.cli.demo import demo
    from core.demo.options import DemoOptions

    defaults = DemoOptions()
    shared = [n for n in inspect.signature(demo).parameters if hasattr(defaults, n)]
    assert len(shared) >= 15
    for name in shared:
        assert inspect.signature(demo).parameters[name].default == getattr(defaults, name), name


@pytest.mark.parametrize(
    ("state", "reason", "line"),
    [
        ("working", "working", "working"),
        ("working", "", "working"),
        ("paused", "you are using the computer", "paused: you are using the computer"),
        ("waiting", "the aggregator has not answered for 3 min", "waiting: the aggregator"),
    ],
)
def test_the_status_line_says_the_reason_only_when_it_adds_to_the_state(state, reason, line):
    assert state_line(Status(state=state, reason=reason)).startswith(line)
    assert state_line(Status(state=state, reason=reason)).count(state) == 1
