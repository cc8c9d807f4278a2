"""The emulated swarm's volunteers (core/demo/emulated_host.py) join a project whose
manifest the swarm shows them late, as a node does, instead of ending the run."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from core.demo import emulated_host
from core.demo.emulated_host import HostSpec, serve_volunteers
from core.namespaces import moehome_validator
from core.project.distribution import ProjectNotFound
from core.project.keys import OwnerKey
from core.project.publish import prepare, serve_project
from net.testing import open_swarm
from tests.swarm.test_project import small_manifest
from tests.waiting import eventually


def spec_for(swarm_addrs: list[str], project: str, workdir: Path) -> HostSpec:
    return HostSpec(
        bootstrap=swarm_addrs,
        project=project,
        experts=[["ffn0.0.0"], ["ffn0.1.1"]],
        host=0,
        workdir=str(workdir),
        seconds_per_row=0.0,
        delay=0.0,
        upload=1e9,
        announce_seconds=30.0,
        announce_ttl=90.0,
    )


async def test_volunteers_look_again_for_a_manifest_published_after_they_start(
    tmp_path, caplog, monkeypatch
):
    monkeypatch.setattr(emulated_host, "LOOK_AGAIN_S", 0.5)
    prepared = prepare(small_manifest(tmp_path), OwnerKey.generate(), (), tmp_path / "owner")
    pid = prepared.signed.project_id
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        spec = spec_for([swarm.node(0).addrs()[0]], pid, tmp_path / "hosts")
        served: list[str] = []

        async def volunteers() -> None:
            served.extend(await serve_volunteers(nursery, spec))

        with caplog.at_level(logging.INFO, logger="core.demo.emulated_host"):
            nursery.start_soon(volunteers)
            # the owner publishes once the first volunteer has looked and found nothing
            await eventually(lambda: "looking again" in caplog.text, 30)
            assert not served
            await nursery.start(serve_project, swarm.node(1), prepared)
            await eventually(lambda: served, 60)
        assert len(served) == 2  # both volunteers serve, the first after looking again
        nursery.cancel_scope.cancel()


async def test_volunteers_give_up_on_a_manifest_that_never_appears(tmp_path, monkeypatch):
    monkeypatch.setattr(emulated_host, "FIRST_LOOK_S", 1.0)
    monkeypatch.setattr(emulated_host, "LOOK_AGAIN_S", 0.2)
    prepared = prepare(small_manifest(tmp_path), OwnerKey.generate(), (), tmp_path / "owner")
    async with (
        open_swarm(1, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        spec = spec_for([swarm.node(0).addrs()[0]], prepared.signed.project_id, tmp_path / "hosts")
        with pytest.raises(ProjectNotFound):
            await serve_volunteers(nursery, spec)
        nursery.cancel_scope.cancel()
