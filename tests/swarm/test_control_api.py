"""The node's local control API, over real HTTP on 127.0.0.1, with a real client."""

from __future__ import annotations

import stat
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

import pytest
import trio

from core.control import ControlClient, ControlError, find_node
from core.control.files import token_file
from core.control.limits import preference_limits
from core.control.models import (
    History,
    HourOfWork,
    PreferencesEvent,
    ProjectSummary,
    Status,
)
from core.control.preferences import Preferences
from core.node.control_server import serve_control
from core.node.events import EventLog
from core.node.governor import Governor
from core.node.preferences import PreferenceStore
from core.node.probes import FakeProbes
from core.project.distribution import ProjectNotFound
from tests.waiting import eventually


class GovernedApi:
    """A NodeApi with a real governor, preference store and event log, and no swarm."""

    def __init__(self, tmp_path) -> None:
        self.preferences = PreferenceStore(tmp_path / "config" / "preferences.json")
        self.events = EventLog()
        self.governor = Governor(FakeProbes(), lambda: self.preferences.current, None)
        self.preferences.subscribe(lambda _: self.events.publish(PreferencesEvent()))
        self.joined: list[str] = []
        self.looked_through: list[list[str]] = []
        self.stopped = False

    def status(self) -> Status:
        d = self.governor.decision
        return Status(
            state="working" if d is None or d.run else "paused",
            reason=d.describe() if d else "starting",
            project=self.joined[-1] if self.joined else None,
        )

    def pause(self) -> None:
        self.governor.pause()

    def resume(self) -> None:
        self.governor.resume()

    def snooze(self, seconds: float) -> None:
        self.governor.snooze(seconds)

    async def settle(self) -> None:
        await self.governor.step()

    def work_history(self, since: float) -> History:
        return History(hours=[HourOfWork(hour=int(since), working_s=60, samples=3)])

    async def find_project(self, project: str, peers: Sequence[str] = ()) -> ProjectSummary:
        self.looked_through.append(list(peers))
        if project not in KNOWN_PROJECTS:
            raise ProjectNotFound(f"no answer about project {project}")
        return KNOWN_PROJECTS[project]

    async def join(self, project: str, peers: Sequence[str] = ()) -> ProjectSummary:
        summary = await self.find_project(project, peers)
        self.joined.append(project)
        return summary

    def leave(self) -> None:
        self.joined.clear()

    async def announced_projects(self) -> list[ProjectSummary]:
        return [ProjectSummary(project="ab" * 16, name="demo")]

    def measure_device(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True


PEER = "/ip4/198.18.0.7/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
KNOWN_PROJECTS = {"0f" * 16: ProjectSummary(project="0f" * 16, name="tiny", experts=4)}


def make_control(tmp_path) -> tuple[GovernedApi, Governor]:
    api = GovernedApi(tmp_path)
    return api, api.governor


async def test_control_api(tmp_path):
    control, governor = make_control(tmp_path)
    data = tmp_path / "data"
    async with trio.open_nursery() as nursery:
        await nursery.start(governor.run)
        url = await nursery.start(serve_control, control, data)
        assert url.startswith("http://127.0.0.1:")
        if sys.platform != "win32":
            assert stat.S_IMODE(token_file(data).stat().st_mode) == 0o600

        async def call(fn, *args) -> Any:
            return await trio.to_thread.run_sync(partial(fn, *args))

        for bad_token in ("", "x" * 43):
            wrong = ControlClient(url, bad_token)
            with pytest.raises(ControlError, match="token"):
                await call(wrong.status)
            wrong.close()

        client = find_node(data)
        assert (await call(client.status)).state == "working"

        async def reason_says(words: str) -> bool:
            return words in (await call(client.status)).reason

        await call(client.pause)
        await eventually(partial(reason_says, "paused by you"))
        await call(client.resume)
        await call(client.snooze, 3600)
        await eventually(partial(reason_says, "snoozed"))

        with pytest.raises(ControlError) as info:
            await call(client.set_preferences, {"pause_above_c": 70, "resume_below_c": 75})
        assert any("resume_below_c" in p for p in info.value.problems)
        with pytest.raises(ControlError) as info:
            await call(client.set_preferences, {"idle_minutes": "soon"})
        assert any(p.startswith("idle_minutes") for p in info.value.problems)

        changed = await call(
            client.set_preferences, {"idle_minutes": 10, "exclusive_apps": ["game.exe"]}
        )
        assert changed.idle_minutes == 10
        assert (await call(client.history, 5.0)).hours[0].hour == 5
        events = await call(client.events, 0)
        assert [e.kind for e in events] == ["preferences"]
        assert [e.id for e in events] == [1]

        project = "0f" * 16
        with pytest.raises(ControlError) as info:
            await call(client.join, "not-an-id")
        assert info.value.problems[0].startswith("project:"), info.value.problems
        with pytest.raises(ControlError) as info:
            await call(client.join, project, ["/ip4/127.0.0.1/tcp/1"])  # no /p2p/ part
        assert info.value.problems[0].startswith("peers.0:"), info.value.problems
        assert control.joined == []  # checked before the node is asked
        assert control.looked_through == []
        # a project that is not found is refused (404) with the node's words, not joined
        with pytest.raises(ControlError, match="no answer about project") as info:
            await call(client.join, "1e" * 16)
        assert control.joined == []
        summary = await call(client.find_project, project, [PEER])
        assert summary == KNOWN_PROJECTS[project]
        assert control.joined == []  # finding is not joining
        assert (await call(client.join, project, [PEER])).project == project
        assert control.looked_through[-1] == [PEER]
        assert (await call(client.leave)).project is None
        assert await call(client.projects) == [ProjectSummary(project="ab" * 16, name="demo")]
        await call(client.shutdown)
        assert control.stopped

        # the tray's rules and the node's are one: what the node serves is what the
        # light package computes (the tray imports the latter)
        assert await call(client.limits) == preference_limits()
        schema = await call(client.openapi)
        assert {"/v1/status", "/v1/events", "/v1/limits", "/v1/preferences"} <= set(schema["paths"])
        assert "Status" in schema["components"]["schemas"]
        client.close()
        nursery.cancel_scope.cancel()

    # preferences survive a restart of the node
    restarted, _ = make_control(tmp_path)
    assert restarted.preferences.current.idle_minutes == 10
    assert restarted.preferences.current.exclusive_apps == ["game.exe"]
    assert restarted.preferences.current != Preferences()


async def test_malformed_requests_get_clear_errors_never_500(tmp_path):
    """Behind the token, but still: NaN, infinity, JSON nested 100,000 deep, a body of
    megabytes, a foreign Host header, and booleans written as "yes" or 1 (issue 14)."""
    import httpx

    control, governor = make_control(tmp_path)
    data = tmp_path / "data"
    async with trio.open_nursery() as nursery:
        await nursery.start(governor.run)
        url = await nursery.start(serve_control, control, data)
        headers = {"Authorization": f"Bearer {token_file(data).read_text().strip()}"}

        def request(method: str, path: str, **kw: Any) -> httpx.Response:
            with httpx.Client(base_url=url, headers=headers, timeout=10) as http:
                return http.request(method, path, **kw)

        async def call(method: str, path: str, **kw: Any) -> httpx.Response:
            return await trio.to_thread.run_sync(partial(request, method, path, **kw))

        for query in ("since=nan", "since=inf", "since=-inf", "since=1e300", "since=x"):
            assert (await call("GET", f"/v1/history?{query}")).status_code == 422, query
        for query in ("wait=nan", "wait=inf", "wait=-1", "since=1.5"):
            answer = await call("GET", f"/v1/events?{query}")
            assert answer.status_code == 422, query
            assert answer.json()["problems"][0].split(":")[0] in ("wait", "since"), query
        deep, deeper = "[" * 30_000 + "]" * 30_000, "[" * 100_000 + "]" * 100_000
        for path in ("/v1/preferences", "/v1/snooze"):
            method = "PUT" if path == "/v1/preferences" else "POST"
            response = await call(method, path, content=deep)
            assert response.status_code in (400, 422), (path, response.status_code)
            assert (await call(method, path, content=deeper)).status_code == 413
            big = await call(method, path, content=b"{" + b" " * (1 << 20) + b"}")
            assert big.status_code == 413, path
        for value in ("yes", 1, "true", None):
            response = await call("PUT", "/v1/preferences", json={"idle_only": value})
            assert response.status_code == 422, value
            assert response.json()["problems"][0].startswith("idle_only")
        foreign = await call("GET", "/v1/status", headers={**headers, "Host": "evil.example"})
        assert foreign.status_code == 403
        assert (await call("GET", "/v1/status")).status_code == 200
        assert control.preferences.current == Preferences()  # nothing above changed anything
        nursery.cancel_scope.cancel()
