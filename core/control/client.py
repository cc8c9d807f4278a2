"""A client of the node's control API (httpx; synchronous, for the tray and the CLI)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from core.control.files import control_file, token_file


class ControlError(Exception):
    """The node refused a request; ``problems`` lists field errors when there are any."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


class NodeNotRunning(ControlError):
    pass


class ControlClient:
    def __init__(self, url: str, token: str, *, timeout: float = 5.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        try:
            response = self._http.request(
                method, path, json=body, timeout=timeout or self._http.timeout
            )
        except httpx.TransportError as exc:
            raise NodeNotRunning(f"the node does not answer ({exc})") from exc
        if response.status_code >= 400:
            try:
                detail = response.json()
            except ValueError:
                detail = {"error": response.text}
            raise ControlError(
                detail.get("error", f"HTTP {response.status_code}"), detail.get("problems")
            )
        return response.json()

    def status(self) -> dict[str, Any]:
        return dict(self._call("GET", "/v1/status"))

    def events(self, since: int = 0, wait: float = 0.0) -> list[dict[str, Any]]:
        """Events after id ``since``; waits up to ``wait`` s for a new one (long poll)."""
        return list(self._call("GET", f"/v1/events?since={since}&wait={wait}", timeout=wait + 5))

    def history(self, since: float = 0.0) -> dict[str, Any]:
        """Work per hour and temperatures over time since ``since`` (unix time)."""
        return dict(self._call("GET", f"/v1/history?since={since}"))

    def pause(self) -> dict[str, Any]:
        return dict(self._call("POST", "/v1/pause"))

    def resume(self) -> dict[str, Any]:
        return dict(self._call("POST", "/v1/resume"))

    def snooze(self, seconds: float) -> dict[str, Any]:
        return dict(self._call("POST", "/v1/snooze", {"seconds": seconds}))

    def preferences(self) -> dict[str, Any]:
        return dict(self._call("GET", "/v1/preferences"))

    def join(self, project: str) -> dict[str, Any]:
        """Serve ``project`` from now on (the node remembers it)."""
        return dict(self._call("POST", "/v1/project", {"project": project}))

    def leave(self) -> dict[str, Any]:
        return dict(self._call("DELETE", "/v1/project"))

    def projects(self) -> list[dict[str, str]]:
        """Projects announced in the swarm (id, name, description)."""
        return list(self._call("GET", "/v1/projects", timeout=30))

    def benchmark(self) -> None:
        """Measure the device again; progress and figures come as "benchmark" events."""
        self._call("POST", "/v1/benchmark")

    def shutdown(self) -> None:
        """Ask the node to stop cleanly (it withdraws its declarations, then exits)."""
        self._call("POST", "/v1/shutdown")

    def set_preferences(self, changes: dict[str, Any]) -> dict[str, Any]:
        return dict(self._call("PUT", "/v1/preferences", changes))


def find_node(data_dir: Path) -> ControlClient:
    """A client of the node running for ``data_dir`` (the files it wrote at start)."""
    try:
        info = json.loads(control_file(data_dir).read_text())
        token = token_file(data_dir).read_text().strip()
    except (OSError, ValueError) as exc:
        raise NodeNotRunning(f"no node is running for {data_dir}") from exc
    return ControlClient(info["url"], token)
