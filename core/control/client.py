"""A client of the node's control API (httpx; synchronous, for the tray and the CLI).
Answers come back as the models of core.control.models."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import TypeAdapter, ValidationError

from core.control.files import control_file, token_file
from core.control.limits import PreferenceLimits
from core.control.models import Accepted, Event, History, ProjectSummary, Status
from core.control.preferences import Preferences

T = TypeVar("T")
#: A join looks for the invite's peers (up to 15 s), then for the manifest (up to 30 s).
JOIN_TIMEOUT_S = 60.0
_EVENTS = TypeAdapter(list[Event])
_PROJECTS = TypeAdapter(list[ProjectSummary])


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

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float | None = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        try:
            response = self._http.request(
                method, path, json=body, params=params, timeout=timeout or self._http.timeout
            )
        except httpx.TransportError as exc:
            raise NodeNotRunning(f"the node does not answer ({exc})") from exc
        try:
            answer = response.json()
        except ValueError:
            answer = {"error": response.text}
        if response.status_code >= 400:
            detail = answer if isinstance(answer, dict) else {}
            raise ControlError(
                str(detail.get("error", f"HTTP {response.status_code}")),
                [str(p) for p in detail.get("problems") or []],
            )
        return answer

    def _model(self, model: type[T] | TypeAdapter[T], method: str, path: str, **kwargs: Any) -> T:
        """The answer to ``method path``, validated as ``model`` (ControlError if it is not)."""
        adapter = model if isinstance(model, TypeAdapter) else TypeAdapter(model)
        answer = self._call(method, path, **kwargs)
        try:
            return adapter.validate_python(answer)
        except ValidationError as exc:
            raise ControlError(f"unexpected answer from the node to {path}: {exc}") from exc

    def status(self) -> Status:
        return self._model(Status, "GET", "/v1/status")

    def events(self, since: int = 0, wait: float = 0.0) -> list[Event]:
        """Events after id ``since``; waits up to ``wait`` s for a new one (long poll)."""
        return self._model(
            _EVENTS, "GET", "/v1/events", params={"since": since, "wait": wait}, timeout=wait + 5
        )

    def history(self, since: float = 0.0) -> History:
        """Work per hour and readings per minute since ``since`` (unix time)."""
        return self._model(History, "GET", "/v1/history", params={"since": since})

    def pause(self) -> Status:
        return self._model(Status, "POST", "/v1/pause")

    def resume(self) -> Status:
        return self._model(Status, "POST", "/v1/resume")

    def snooze(self, seconds: float) -> Status:
        return self._model(Status, "POST", "/v1/snooze", body={"seconds": seconds})

    def preferences(self) -> Preferences:
        return self._model(Preferences, "GET", "/v1/preferences")

    def set_preferences(self, changes: dict[str, Any]) -> Preferences:
        return self._model(Preferences, "PUT", "/v1/preferences", body=changes)

    def limits(self) -> PreferenceLimits:
        """The node's defaults and ranges of the preferences, the format of a project id."""
        return self._model(PreferenceLimits, "GET", "/v1/limits")

    def join(self, project: str, peers: Sequence[str] = ()) -> Status:
        """Serve ``project`` from now on (the node remembers it), once its manifest is
        found and verified, looking through ``peers`` (an invite's) too. ControlError
        when it is not found (the message says why, for the volunteer)."""
        body = {"project": project, "peers": list(peers)}
        return self._model(Status, "POST", "/v1/project", body=body, timeout=JOIN_TIMEOUT_S)

    def find_project(self, project: str, peers: Sequence[str] = ()) -> ProjectSummary:
        """What the project is (from its verified manifest), without joining it."""
        body = {"project": project, "peers": list(peers)}
        return self._model(
            ProjectSummary, "POST", "/v1/projects/find", body=body, timeout=JOIN_TIMEOUT_S
        )

    def leave(self) -> Status:
        return self._model(Status, "DELETE", "/v1/project")

    def projects(self) -> list[ProjectSummary]:
        """Projects announced in the swarm."""
        return self._model(_PROJECTS, "GET", "/v1/projects", timeout=30)

    def benchmark(self) -> None:
        """Measure the device again; progress and figures come as "benchmark" events."""
        self._model(Accepted, "POST", "/v1/benchmark")

    def shutdown(self) -> None:
        """Ask the node to stop cleanly (it withdraws its declarations, then exits)."""
        self._model(Accepted, "POST", "/v1/shutdown")

    def openapi(self) -> dict[str, Any]:
        """The API's OpenAPI schema."""
        return dict(self._call("GET", "/v1/openapi.json"))


def find_node(data_dir: Path) -> ControlClient:
    """A client of the node running for ``data_dir`` (the files it wrote at start)."""
    try:
        info = json.loads(control_file(data_dir).read_text())
        token = token_file(data_dir).read_text().strip()
    except (OSError, ValueError) as exc:
        raise NodeNotRunning(f"no node is running for {data_dir}") from exc
    return ControlClient(info["url"], token)
