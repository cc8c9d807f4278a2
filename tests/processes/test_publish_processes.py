"""publish -> a volunteer in another process discovers the project by id, fetches and
verifies the weights, loads the experts and serves them. Plus the owner CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from typer.testing import CliRunner

from core.cli import app
from core.experts.registry import build_expert
from core.experts.spec import seed_for
from core.experts.weights import weights_hash
from core.namespaces import moehome_validator
from core.project.keys import OwnerKey
from core.project.owner import OwnerFiles
from core.project.publish import prepare, serve_project
from core.protocol.expert_methods import INFO
from net import Identity, Peer, parse_peer_addr
from tests.child_processes import stop_processes
from tests.swarm.test_project import small_manifest

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.mark.slow
async def test_a_volunteer_process_joins_a_published_project(tmp_path):
    prepared = prepare(small_manifest(tmp_path), OwnerKey.generate(), (), tmp_path / "owner")
    pid = prepared.signed.project_id
    async with trio.open_nursery() as nursery:
        owner_peer: Peer = await nursery.start(
            Peer(Identity.generate(), validator=moehome_validator()).run
        )
        await nursery.start(serve_project, owner_peer, prepared)
        env = {**os.environ, "MOEHOME_DATA_DIR": str(tmp_path / "volunteer")}
        cmd = [
            sys.executable,
            "-m",
            "core.cli",
            "--quiet",
            "experts",
            "serve",
            "--ephemeral",
            "--project",
            pid,
            "-u",
            "ffn0.1.1",
            "-b",
            owner_peer.addrs()[0],
        ]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            line = await trio.to_thread.run_sync(proc.stdout.readline)
            assert line.startswith("/ip4/"), line
            volunteer = parse_peer_addr(line.strip()).peer_id
            await owner_peer.host.connect_addr(line.strip())
            info = await owner_peer.rpc.call(volunteer, INFO, {"uid": "ffn0.1.1"})
            spec = prepared.signed.manifest.model.expert_spec()
            assert info.meta["sha256"] == weights_hash(
                build_expert(spec, seed=seed_for(0, "ffn0.1.1"))
            )
            pins = json.loads((tmp_path / "volunteer" / "pinned-owners.json").read_text())
            assert pins == {pid: prepared.signed.owner_key.hex()}
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            if proc.stdout:
                proc.stdout.close()
        nursery.cancel_scope.cancel()


def test_owner_cli_init_new_publish_and_rotate(tmp_path, monkeypatch):
    monkeypatch.setenv("MOEHOME_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("MOEHOME_OWNER_PASSPHRASE", "s3cret")
    result = runner.invoke(app, ["owner", "init", "--passphrase"])
    assert result.exit_code == 0, result.output
    assert "fingerprint:" in result.output
    assert runner.invoke(app, ["owner", "init"]).exit_code == 2  # never overwritten silently

    manifest = tmp_path / "proj.toml"
    result = runner.invoke(app, ["owner", "new", str(manifest), "--name", "cli-test"])
    assert result.exit_code == 0, result.output
    manifest.write_text(manifest.read_text().replace("grid = [2, 4]", "grid = [2, 2]"))
    result = runner.invoke(app, ["owner", "publish", str(manifest), "--no-serve"])
    assert result.exit_code == 0, result.output
    pid = result.output.split("project id:")[1].split()[0]

    bad = tmp_path / "bad.toml"
    bad.write_text(manifest.read_text().replace("learning_rate = 0.001", "learning_rate = 0"))
    result = runner.invoke(app, ["owner", "publish", str(bad), "--no-serve"])
    assert result.exit_code == 2
    assert "training.learning_rate" in result.output

    result = runner.invoke(app, ["owner", "rotate-key"])
    assert result.exit_code == 0, result.output
    files = OwnerFiles(tmp_path / "config" / "owner")
    assert len(files.load_rotations()) == 1
    result = runner.invoke(
        app, ["owner", "publish", str(manifest), "--no-serve", "--workdir", str(tmp_path / "w2")]
    )
    assert result.exit_code == 0, result.output
    assert result.output.split("project id:")[1].split()[0] == pid  # same project after rotation


@pytest.mark.slow
def test_a_bootstrap_peer_and_a_publisher_on_one_computer_reach_each_other(tmp_path):
    """Each role has its own key on one computer. At 8609050 `moehome peer` and `owner
    publish` shared it: publish refused to dial itself, announced to no peer, and still
    printed an invite and "serving project"."""
    env = {**os.environ, "MOEHOME_DATA_DIR": str(tmp_path / "data")}
    env["MOEHOME_CONFIG_DIR"] = str(tmp_path / "config")
    env["MOEHOME_OWNER_PASSPHRASE"] = ""
    cli = [sys.executable, "-m", "core.cli"]
    procs: list[subprocess.Popen[str]] = []
    try:
        subprocess.run([*cli, "owner", "init"], env=env, cwd=ROOT, check=True, timeout=60)
        manifest = small_manifest(tmp_path)
        peer = subprocess.Popen(
            [*cli, "peer"], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        procs.append(peer)
        assert peer.stdout is not None
        address = peer.stdout.readline().strip()
        assert address.startswith("/ip4/"), address
        publish = subprocess.Popen(
            [*cli, "owner", "publish", str(manifest), "-b", address],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(publish)
        assert publish.stdout is not None
        lines: list[str] = []
        while not lines or not (lines[-1].startswith("invite:") or lines[-1] == ""):
            lines.append(publish.stdout.readline())  # "" at its end: it exited
        assert lines[-1].startswith("invite: moehome://join/"), lines
        assert publish.poll() is None  # serving
        publish.terminate()
        _, err = publish.communicate(timeout=30)
        assert "could not announce" not in err
        assert "refusing to dial ourselves" not in err

        # a bootstrap address where nobody answers: publishing says so and gives up
        gone = f"/ip4/127.0.0.1/tcp/1/p2p/{Identity.generate().peer_id}"
        done = subprocess.run(
            [*cli, "owner", "publish", str(manifest), "-b", gone],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1
        assert "announced to no peer" in done.stderr
        assert "invite:" not in done.stdout
    finally:
        stop_processes(procs)
