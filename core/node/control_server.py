"""The node's side of the control API: Starlette on hypercorn (trio), bound to 127.0.0.1,
every request checked against a random token (constant-time comparison)."""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from core.control.files import write_address, write_token
from core.node.preferences import Preferences, PreferencesError, save_preferences

log = logging.getLogger(__name__)


class NodeControl:
    """What the API can see and do; the node implements it (tests use it directly)."""

    def __init__(
        self,
        status: Callable[[], dict[str, Any]],
        pause: Callable[[], None],
        resume: Callable[[], None],
        snooze: Callable[[float], None],
        preferences_path: Path,
        preferences: Preferences,
        after_command: Callable[[], Awaitable[Any]] | None = None,
        history: Callable[[float], dict[str, Any]] | None = None,
        join: Callable[[str], None] | None = None,
        leave: Callable[[], None] | None = None,
        projects: Callable[[], Awaitable[list[dict[str, str]]]] | None = None,
        benchmark: Callable[[], None] | None = None,
        shutdown: Callable[[], None] | None = None,
    ) -> None:
        self.shutdown = shutdown  # stop the node cleanly (the tray's Quit)
        self.projects = projects  # the projects announced in the swarm
        self.benchmark = benchmark  # measure the device again (progress comes as events)
        self.join = join  # raises ValueError for a malformed project id
        self.leave = leave
        self.history = history  # since (unix time) -> {"hours": [...], "temperatures": [...]}
        self.after_command = after_command  # e.g. the governor deciding at once
        self.status = status
        self.pause = pause
        self.resume = resume
        self.snooze = snooze
        self.preferences_path = preferences_path
        self.preferences = preferences
        self._events: list[dict[str, Any]] = []
        self._next_id = 1
        self._new_event = trio.Event()

    def event(self, kind: str, **data: Any) -> None:
        """Record an event for the stream (kinds: state, preferences, contribution, ...)."""
        self._events.append(
            {"id": self._next_id, "at": round(time.time(), 3), "kind": kind, **data}
        )
        self._next_id += 1
        del self._events[:-1000]
        self._new_event.set()
        self._new_event = trio.Event()

    async def events_after(self, since: int, wait: float) -> list[dict[str, Any]]:
        newer = [e for e in self._events if e["id"] > since]
        if not newer and wait > 0:
            with trio.move_on_after(min(wait, 30.0)):
                await self._new_event.wait()
            newer = [e for e in self._events if e["id"] > since]
        return newer

    def set_preferences(self, changes: dict[str, Any]) -> Preferences:
        prefs = self.preferences.updated(changes)  # PreferencesError names the field
        save_preferences(prefs, self.preferences_path)
        self.preferences = prefs
        self.event("preferences")
        return prefs


def build_app(control: NodeControl, token: str) -> Starlette:
    class TokenGate(BaseHTTPMiddleware):
        async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
            # a page that rebinds its own name to 127.0.0.1 sends its own Host: refused
            # before the token is even looked at
            if _host_name(request.headers.get("host", "")) not in LOCAL_HOSTS:
                return JSONResponse({"error": "the control API answers on 127.0.0.1 only"}, 403)
            given = request.headers.get("authorization", "").removeprefix("Bearer ")
            if not hmac.compare_digest(given.encode(), token.encode()):
                return JSONResponse({"error": "missing or wrong token"}, status_code=401)
            return await call_next(request)

    async def status(request: Request) -> JSONResponse:
        return JSONResponse(control.status())

    async def events(request: Request) -> JSONResponse:
        try:
            since = int(request.query_params.get("since", "0"))
            wait = _number(request.query_params.get("wait", "0"), 0.0, 3600.0)
        except ValueError:
            return JSONResponse(
                {"error": "since must be an integer, wait a number of seconds"}, status_code=400
            )
        return JSONResponse(await control.events_after(since, wait))

    def command(action: Callable[[], None]) -> Callable[[Request], Awaitable[JSONResponse]]:
        async def endpoint(request: Request) -> JSONResponse:
            action()
            if control.after_command is not None:
                await control.after_command()  # so the answer shows the new state
            return JSONResponse(control.status())

        return endpoint

    async def snooze(request: Request) -> JSONResponse:
        body = await _json(request)
        if isinstance(body, JSONResponse):
            return body
        seconds = body.get("seconds") if isinstance(body, dict) else None
        if (
            not isinstance(seconds, (int, float))
            or isinstance(seconds, bool)
            or not 0 < seconds <= 7 * 86400
        ):
            return JSONResponse(
                {
                    "error": "seconds: a number of seconds up to a week",
                    "problems": ["seconds: must be 0..604800"],
                },
                status_code=422,
            )
        control.snooze(float(seconds))
        if control.after_command is not None:
            await control.after_command()
        return JSONResponse(control.status())

    async def preferences(request: Request) -> JSONResponse:
        if request.method == "GET":
            return JSONResponse(control.preferences.model_dump(mode="json"))
        body = await _json(request)
        if isinstance(body, JSONResponse):
            return body
        if not isinstance(body, dict):
            return JSONResponse({"error": "send a JSON object of preferences"}, status_code=400)
        try:
            prefs = control.set_preferences(body)
        except PreferencesError as exc:
            return JSONResponse({"error": str(exc), "problems": exc.problems}, status_code=422)
        if control.after_command is not None:
            await control.after_command()  # new limits apply at once
        return JSONResponse(prefs.model_dump(mode="json"))

    async def project(request: Request) -> JSONResponse:
        if control.join is None or control.leave is None:
            return JSONResponse({"error": "this node cannot change projects"}, status_code=404)
        if request.method == "DELETE":
            control.leave()
            return JSONResponse(control.status())
        body = await _json(request)
        if isinstance(body, JSONResponse):
            return body
        project_id = body.get("project") if isinstance(body, dict) else None
        if not isinstance(project_id, str):
            return JSONResponse(
                {"error": 'send {"project": "<project id>"}', "problems": ["project: missing"]},
                status_code=422,
            )
        try:
            control.join(project_id.strip())
        except ValueError as exc:
            return JSONResponse(
                {"error": str(exc), "problems": [f"project: {exc}"]}, status_code=422
            )
        return JSONResponse(control.status())

    async def projects(request: Request) -> JSONResponse:
        if control.projects is None:
            return JSONResponse([])
        return JSONResponse(await control.projects())

    async def benchmark(request: Request) -> JSONResponse:
        if control.benchmark is None:
            return JSONResponse({"error": "this node cannot measure the device"}, status_code=404)
        control.benchmark()
        return JSONResponse({"started": True})

    async def shutdown(request: Request) -> JSONResponse:
        if control.shutdown is None:
            return JSONResponse({"error": "this node cannot be stopped from here"}, status_code=404)
        control.shutdown()
        return JSONResponse({"stopping": True})

    async def history(request: Request) -> JSONResponse:
        if control.history is None:
            return JSONResponse({"hours": [], "temperatures": []})
        try:
            since = _number(request.query_params.get("since", "0"), 0.0, time.time() + 86400)
        except ValueError:
            return JSONResponse({"error": "since must be a unix time"}, status_code=400)
        return JSONResponse(control.history(since))

    routes = [
        Route("/v1/history", history),
        Route("/v1/status", status),
        Route("/v1/events", events),
        Route("/v1/pause", command(control.pause), methods=["POST"]),
        Route("/v1/resume", command(control.resume), methods=["POST"]),
        Route("/v1/snooze", snooze, methods=["POST"]),
        Route("/v1/preferences", preferences, methods=["GET", "PUT"]),
        Route("/v1/project", project, methods=["POST", "DELETE"]),
        Route("/v1/projects", projects),
        Route("/v1/benchmark", benchmark, methods=["POST"]),
        Route("/v1/shutdown", shutdown, methods=["POST"]),
    ]
    return Starlette(routes=routes, middleware=[Middleware(TokenGate)])


#: Names the control API answers to (its Host header): the loopback address only.
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})
#: The largest request body read (preferences are a few hundred bytes).
MAX_BODY_BYTES = 64 * 1024


def _host_name(host: str) -> str:
    """``host`` of a Host header ``host:port`` (IPv6 in brackets kept as is)."""
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _number(text: str, low: float, high: float) -> float:
    """A finite number within [low, high] (NaN and infinity are no numbers here)."""
    value = float(text)
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{text!r} is outside {low:g}..{high:g}")
    return value


async def _json(request: Request) -> Any:
    """The body as JSON; None when it is not JSON (too deep counts as not JSON), or a
    413 response when it is larger than MAX_BODY_BYTES (read no further)."""
    body = bytearray()
    async with contextlib.aclosing(request.stream()) as chunks:
        async for chunk in chunks:
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                return JSONResponse({"error": f"body over {MAX_BODY_BYTES} bytes"}, status_code=413)
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


async def serve_control(
    control: NodeControl,
    data_dir: Path,
    *,
    port: int = 0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; reports the URL. Writes the token and address files."""
    token = write_token(data_dir)
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")

    async def started(
        *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await serve(build_app(control, token), config, task_status=task_status)  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(started)
        url = binds[0]
        write_address(data_dir, url, os.getpid())
        log.info("control API at %s", url)
        task_status.started(url)
        await trio.sleep_forever()
