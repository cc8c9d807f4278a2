"""The node's local control API, over real HTTP on 127.0.0.1, with a real client."""

from __future__ import annotations

import stat
import sys
from functools import partial
from typing import Any

import pytest
import trio

from core.control import ControlClient, ControlError, find_node
from core.control.files import token_file
from core.node.control_server import NodeControl, serve_control
from core.node.governor import Governor
from core.node.preferences import Preferences, load_preferences
from core.node.probes import FakeProbes
from tests.waiting import eventually


def make_control(tmp_path) -> tuple[NodeControl, Governor]:
    prefs_path = tmp_path / "config" / "preferences.json"
    holder: dict[str, NodeControl] = {}
    governor = Governor(FakeProbes(), lambda: holder["c"].preferences, None)

    def status() -> dict[str, Any]:
        d = governor.decision
        return {
            "state": "working" if d is None or d.run else "paused",
            "reason": d.describe() if d else "starting",
        }

    control = NodeControl(
        status,
        governor.pause,
        governor.resume,
        governor.snooze,
        prefs_path,
        load_preferences(prefs_path),
        history=lambda since: {"hours": [{"since": since}], "temperatures": []},
    )
    holder["c"] = control
    return control, governor


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
        assert (await call(client.status))["state"] == "working"

        async def reason_says(words: str) -> bool:
            return words in (await call(client.status))["reason"]

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
        assert changed["idle_minutes"] == 10
        assert (await call(client.history, 5.0))["hours"] == [{"since": 5.0}]
        events = await call(client.events, 0)
        assert [e["kind"] for e in events] == ["preferences"]
        client.close()
        nursery.cancel_scope.cancel()

    # preferences survive a restart of the node
    restarted, _ = make_control(tmp_path)
    assert restarted.preferences.idle_minutes == 10
    assert restarted.preferences.exclusive_apps == ["game.exe"]
    assert restarted.preferences != Preferences()


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
            assert (await call("GET", f"/v1/history?{query}")).status_code == 400, query
        for query in ("wait=nan", "wait=inf", "wait=-1", "since=1.5"):
            assert (await call("GET", f"/v1/events?{query}")).status_code == 400, query
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
        assert control.preferences == Preferences()  # nothing above changed anything
        nursery.cancel_scope.cancel()
