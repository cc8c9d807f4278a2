"""The project page (issue 42): built from signed data only, rendered by a real headless
Chromium (Debian's package; .ci/run installs it), with the same figures as ``moehome
owner status --json``, written as static files and served over HTTP.

The swarm is real peers on 127.0.0.1 in this process (an owner serving the project, an
aggregator with a round behind it and a trainer's signed evaluations, a volunteer's
expert record, a ban by the aggregator and a forged one by a stranger); the CLI's
commands run as the owner would run them, each its own process. The aggregator runs no
round while they look, so that both see the same figures. Screenshots are kept under
artifacts/screenshots/ for a person to look at."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from core.aggregator.core import AggregatorCore
from core.aggregator.evaluations import EvaluationStore
from core.aggregator.service import AggregatorService
from core.experts.records import SERVING, ExpertAnnouncement, expert_key
from core.namespaces import moehome_validator
from core.page.collect import collect_page
from core.project.bans import BanBoard
from core.project.keys import OwnerKey
from core.project.publish import prepare, serve_project
from core.project.template import write_template
from core.protocol.bans import Ban, ban_key, encode_bans
from core.protocol.evaluations import EVALUATION, EvaluationPoint
from core.trainer.evaluations import EvaluationPublisher
from net import BadRequest, Identity
from net.testing import open_swarm
from tests.page_figures import number, read_figures
from tests.unit.test_aggregator_core import UID, contribution, settings

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
MOEHOME = [sys.executable, "-m", "core.cli"]
LOSSES = [5.5, 4.1, 3.2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        why = "Chromium is not installed (.ci/run installs Debian's chromium)"
        if os.environ.get("MOEHOME_REQUIRE_LAB") == "1":
            pytest.fail(f"MOEHOME_REQUIRE_LAB=1 but {why}")
        pytest.skip(why)
    return found


def headless(browser: str, *args: str, timeout: float = 60) -> str:
    """Chromium without a display, as root may run it (no sandbox), its stdout."""
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def manifest(tmp_path: Path, aggregator: Identity, trainer: Identity) -> Path:
    path = tmp_path / "page-test.toml"
    write_template(
        path,
        "page-test",
        aggregator_key=aggregator.public_key.hex(),
        trainer_key=trainer.public_key.hex(),
    )
    text = path.read_text().replace("grid = [2, 4]", "grid = [2, 2]")
    path.write_text(text.replace("mixture_layers = 2", "mixture_layers = 1"))
    return path


async def cli(*args: str, env: dict[str, str]) -> str:
    done = await trio.run_process(
        [*MOEHOME, *args], capture_stdout=True, capture_stderr=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return str(done.stdout.decode())


async def test_the_project_page_shows_what_the_projects_keys_signed_as_owner_status_does(
    tmp_path: Path,
) -> None:
    browser = chromium()
    async with (
        open_swarm(5, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        owner, aggregator, trainer, volunteer, stranger = (swarm.node(i) for i in range(5))
        prepared = prepare(
            manifest(tmp_path, aggregator.identity, trainer.identity),
            OwnerKey.generate(),
            (),
            tmp_path / "owner",
        )
        signed = prepared.signed
        pid = signed.project_id
        await nursery.start(serve_project, owner, prepared)

        # the aggregator: three volunteers' contributions made a round, and credit
        core = AggregatorCore(
            settings(project=pid, trainers=frozenset({trainer.identity.public_key})),
            tmp_path / "agg",
        )
        contributors = [Identity.from_seed(bytes([40 + i]) * 32) for i in range(3)]
        for i, who in enumerate(contributors):
            core.submit(
                *contribution(core, who, samples=8 * (i + 1), signer=trainer.identity, project=pid)
            )
        core.run_round(UID)
        store = EvaluationStore(tmp_path / "agg" / "evaluations.bin", pid, core.settings.trainers)
        await nursery.start(AggregatorService(aggregator, core, evaluations=store).run)

        # the trainer's evaluations, signed, sent as a trainer sends them
        clock = iter([1_000.0, 1_300.0, 1_600.0])
        publisher = EvaluationPublisher(trainer, signed, clock=lambda: next(clock))
        await nursery.start(publisher.run)
        for step, loss in enumerate(LOSSES):
            publisher.publish(
                step=100 * step, samples=1600 * step, tokens=204_800 * step, loss=loss
            )
        await publisher.close()
        assert (publisher.delivered, publisher.failed) == (3, 0)
        # nobody else may add to the curve: not a stranger, not a point of another project
        forged = EvaluationPoint.sign(
            stranger.identity, pid, step=1, samples=1, tokens=1, loss=0.01, time=1_700.0
        )
        with pytest.raises(BadRequest, match="only the manifest's trainers"):
            await stranger.rpc.call(aggregator.peer_id, EVALUATION, {"point": forged.encode()})
        elsewhere = EvaluationPoint.sign(
            trainer.identity, "cd" * 16, step=1, samples=1, tokens=1, loss=0.01, time=1_700.0
        )
        with pytest.raises(BadRequest, match="another project"):
            await trainer.rpc.call(aggregator.peer_id, EVALUATION, {"point": elsewhere.encode()})

        # a volunteer serves one expert; the aggregator banned a cheater; a stranger's
        # ban record (no key of the manifest) must not show
        await volunteer.dht.put(
            expert_key(pid, "ffn0.0.0"),
            ExpertAnnouncement("ffn0.0.0", SERVING, 1, "0" * 64, 0.0, 64).encode(),
            600,
        )
        board = BanBoard(aggregator, signed)
        cheat = "its gradient is not what its receipts compute"
        board.accuse(str(stranger.peer_id), cheat, b"", 3.0)
        await board.refresh()
        framed = Ban(str(volunteer.peer_id), "framed by a stranger", 1e12, b"", 1.0)
        await stranger.dht.put(ban_key(pid), encode_bans(pid, [framed]), 600)

        # the page's data, gathered as `owner page` does
        bootstrap = [str(a) for a in owner.addrs()[:1]]
        data = await collect_page(stranger, pid, tmp_path / "reader", bootstrap)
        (curve,) = data["loss"]
        assert curve["trainer"] == str(trainer.peer_id)
        assert [p[4] for p in curve["points"]] == LOSSES
        assert data["throughput"]["samples_per_s"] == pytest.approx(3200 / 600)
        assert [b["reason"] for b in data["bans"]] == [cheat]
        assert data["bans"][0]["by"] == str(aggregator.peer_id)
        credit = {row["key"]: row["credit"] for row in data["leaderboard"]}
        assert credit == {
            who.public_key.hex(): pytest.approx(core.credit.total(who.public_key.hex()))
            for who in contributors
        }
        assert [r["rank"] for r in data["leaderboard"]] == [1, 2, 3]
        assert data["leaderboard"][0]["credit"] >= data["leaderboard"][-1]["credit"] > 0

        # the owner's CLI, each command its own process: status, and the page written
        env = {
            **os.environ,
            "MOEHOME_DATA_DIR": str(tmp_path / "cli-data"),
            "MOEHOME_CONFIG_DIR": str(tmp_path / "cli-config"),
            "PYTHONPATH": str(ROOT),
        }
        b = ["-b", bootstrap[0]]
        status = json.loads(await cli("owner", "status", pid, *b, "--json", env=env))
        folder = tmp_path / "page"
        printed = await cli("owner", "page", pid, *b, "--out", str(folder), env=env)
        assert f"page: {folder / 'index.html'}" in printed

        # Chromium renders it; its figures are the CLI's
        dom = await trio.to_thread.run_sync(
            lambda: headless(browser, "--dump-dom", (folder / "index.html").as_uri())
        )
        shown = read_figures(dom)
        f = shown.figures
        assert f["name"] == [signed.manifest.project.name]
        assert number(f["experts_covered"][0]) == status["experts_covered"] == 1
        assert number(f["experts_total"][0]) == status["experts_total"] == 4
        assert number(f["volunteers"][0]) == len(status["volunteers"]) == 1
        accepted = sum(agg["accepted"] for agg in status["aggregators"])
        assert number(f["accepted"][0]) == accepted == 3
        assert [number(x) for x in f["aggregator_accepted"]] == [accepted]
        listed = status["aggregators"][0]["contributors"]
        assert sorted(number(x) for x in f["credit"]) == sorted(
            round(c["credit"]) for c in listed.values()
        )
        assert number(f["loss"][0]) == LOSSES[-1]
        assert number(f["bans"][0]) == 1
        assert shown.rows == {"trainer": 1, "leader": 3, "expert": 4, "aggregator": 1, "ban": 1}
        assert "framed by a stranger" not in dom
        assert f["invite"][0].startswith(f"moehome://join/{pid}")
        SHOTS.mkdir(parents=True, exist_ok=True)
        shot = SHOTS / "project-page.png"
        await trio.to_thread.run_sync(
            lambda: headless(
                browser,
                f"--screenshot={shot}",
                "--window-size=1000,2000",
                (folder / "index.html").as_uri(),
            )
        )
        assert shot.stat().st_size > 20_000  # drawn: text, tables, a chart
        page_json = json.loads((folder / "page.json").read_text())
        assert page_json["status"]["experts_covered"] == status["experts_covered"]
        assert all(math.isfinite(p[4]) for p in page_json["loss"][0]["points"])

        # served: the same page over HTTP while `owner page --serve` runs
        served = await trio.to_thread.run_sync(
            lambda: subprocess.Popen(
                [
                    *MOEHOME,
                    "owner",
                    "page",
                    pid,
                    *b,
                    "--out",
                    str(tmp_path / "served"),
                    "--serve",
                    "127.0.0.1:0",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                text=True,
            )
        )
        try:
            assert served.stdout is not None
            url = ""
            with trio.fail_after(60):
                while not url:
                    line = await trio.to_thread.run_sync(served.stdout.readline)
                    assert line, served.stderr.read() if served.stderr else "exited"
                    if line.startswith("served at: "):
                        url = line.split()[2]
            async with httpx.AsyncClient() as http:
                page = await http.get(url)
                assert page.status_code == 200
                assert "text/html" in page.headers["content-type"]
                assert (await http.get(url + "page.json")).json()["project"]["id"] == pid
                assert (await http.get(url + "../../etc/passwd")).status_code == 404
            served_dom = await trio.to_thread.run_sync(lambda: headless(browser, "--dump-dom", url))
            again = read_figures(served_dom)
            assert again.figures["experts_covered"] == f["experts_covered"]
            assert again.figures["credit"] == f["credit"]
        finally:
            served.terminate()
            served.communicate(timeout=30)  # and its pipes closed
        core.close()
        nursery.cancel_scope.cancel()
