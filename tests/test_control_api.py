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
        await call(client.pause)
        await trio.sleep(0.1)
        assert "paused by you" in (await call(client.status))["reason"]
        await call(client.resume)
        await call(client.snooze, 3600)
        await trio.sleep(0.1)
        assert "snoozed" in (await call(client.status))["reason"]

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
