"""The node's side of the control API: FastAPI on hypercorn (trio), bound to 127.0.0.1,
every request checked against a random token (constant-time comparison). The models it
answers with live in core.control.models (the light package the tray imports)."""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Protocol

import trio
from fastapi import APIRouter, FastAPI, Query
from fastapi.exceptions import RequestValidationError
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.control.files import write_address, write_token
from core.control.limits import PreferenceLimits, preference_limits
from core.control.models import (
    Accepted,
    Event,
    History,
    JoinRequest,
    Problem,
    ProjectSummary,
    SnoozeRequest,
    Status,
)
from core.control.preferences import Preferences, PreferencesError
from core.node.events import EventLog
from core.node.preferences import PreferenceStore
from core.project.distribution import ProjectNotFound

log = logging.getLogger(__name__)


class NodeApi(Protocol):
    """What the control API can see and do; the node implements it (tests may fake it)."""

    preferences: PreferenceStore
    events: EventLog

    def status(self) -> Status: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def snooze(self, seconds: float) -> None: ...
    async def settle(self) -> None:
        """Let a command take effect, so that the answer shows the new state."""

    def work_history(self, since: float) -> History: ...
    async def find_project(self, project: str, peers: Sequence[str] = ()) -> ProjectSummary:
        """The project's verified manifest, summed up; ProjectNotFound says why not."""

    async def join(self, project: str, peers: Sequence[str] = ()) -> ProjectSummary:
        """Serve the project once its manifest is found and verified (as find_project)."""

    def leave(self) -> None: ...
    async def announced_projects(self) -> list[ProjectSummary]: ...
    def measure_device(self) -> None: ...
    def stop(self) -> None: ...


def build_app(node: NodeApi, token: str) -> FastAPI:
    """The API: every route answers with a model of core.control.models (its schema at
    /v1/openapi.json); refusals are a :class:`Problem`."""
    app = FastAPI(
        title="moehome node control API",
        version="1",
        openapi_url="/v1/openapi.json",
        docs_url=None,  # the documentation pages load scripts from the internet
        redoc_url=None,
        responses={422: {"model": Problem}, 401: {"model": Problem}},
    )
    app.add_middleware(LocalGate, token=token)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(PreferencesError, _invalid_preferences)
    app.add_exception_handler(Refused, _refused)
    app.add_exception_handler(ProjectNotFound, _not_found)
    app.add_exception_handler(RecursionError, _too_deep)
    v1 = APIRouter(prefix="/v1")

    async def after_command() -> Status:
        await node.settle()
        return node.status()

    @v1.get("/status")
    async def status() -> Status:
        return node.status()

    @v1.get("/events")
    async def events(
        since: Annotated[int, Query(ge=0)] = 0,
        wait: Annotated[float, Query(ge=0, le=3600, allow_inf_nan=False)] = 0.0,
    ) -> list[Event]:
        """Events after id ``since``; waits up to ``wait`` s (at most 30) for a new one."""
        return await node.events.wait_after(since, wait)

    @v1.post("/pause")
    async def pause() -> Status:
        node.pause()
        return await after_command()

    @v1.post("/resume")
    async def resume() -> Status:
        node.resume()
        return await after_command()

    @v1.post("/snooze")
    async def snooze(request: SnoozeRequest) -> Status:
        node.snooze(request.seconds)
        return await after_command()

    @v1.get("/preferences")
    async def preferences() -> Preferences:
        return node.preferences.current

    @v1.put("/preferences")
    async def set_preferences(changes: dict[str, Any]) -> Preferences:
        """Change some preferences; the result is validated as a whole."""
        prefs = node.preferences.update(changes)  # PreferencesError: 422 with problems
        await node.settle()  # new limits apply at once
        return prefs

    @v1.get("/limits")
    async def limits() -> PreferenceLimits:
        """Defaults and ranges of the preferences, the format of a project id."""
        return preference_limits()

    @v1.post("/project", responses={404: {"model": Problem}})
    async def join(request: JoinRequest) -> Status:
        """Serve a project from now on, once its signed manifest is found and verified;
        404 when it is not (the error says why, in words for the volunteer)."""
        await node.join(request.project, request.peers)  # ProjectNotFound: 404
        return node.status()

    @v1.post("/projects/find", responses={404: {"model": Problem}})
    async def find(request: JoinRequest) -> ProjectSummary:
        """A project's summary (from its verified manifest) before joining it."""
        return await node.find_project(request.project, request.peers)

    @v1.delete("/project")
    async def leave() -> Status:
        node.leave()
        return node.status()

    @v1.get("/projects")
    async def projects() -> list[ProjectSummary]:
        """The projects announced in the swarm."""
        return await node.announced_projects()

    @v1.post("/benchmark")
    async def benchmark() -> Accepted:
        """Measure the device again; progress and figures come as benchmark events."""
        node.measure_device()
        return Accepted()

    @v1.post("/shutdown")
    async def shutdown() -> Accepted:
        """Stop the node cleanly (it withdraws its declarations first)."""
        node.stop()
        return Accepted()

    @v1.get("/history")
    async def history(since: Annotated[float, Query(ge=0, allow_inf_nan=False)] = 0.0) -> History:
        """Work per hour and readings per minute since ``since`` (unix time)."""
        if since > time.time() + 86400:
            raise Refused(422, "since: a unix time, not in the future", ["since: in the future"])
        return node.work_history(since)

    app.include_router(v1)
    return app


#: Names the control API answers to (its Host header): the loopback address only.
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})
#: The largest request body read (preferences are a few hundred bytes).
MAX_BODY_BYTES = 64 * 1024


class Refused(Exception):
    """A request the node turns down, with the HTTP status and the field problems."""

    def __init__(self, status_code: int, error: str, problems: list[str] | None = None) -> None:
        super().__init__(error)
        self.status_code = status_code
        self.problems = problems or []


async def _not_found(request: Request, exc: Exception) -> Response:
    """A project the node looked for and did not find: its words, for the volunteer."""
    return _problem(404, str(exc))


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    return _problem(exc.status_code, str(exc), exc.problems)


class LocalGate:
    """In front of every route: a page that rebinds its own name to 127.0.0.1 sends its
    own Host, refused before the token is even looked at; then the token (compared in
    constant time); then the body, read no further than MAX_BODY_BYTES."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if _host_name(headers.get("host", "")) not in LOCAL_HOSTS:
            await _problem(403, "the control API answers on 127.0.0.1 only")(scope, receive, send)
            return
        given = headers.get("authorization", "").removeprefix("Bearer ").encode()
        if not hmac.compare_digest(given, self.token):
            await _problem(401, "missing or wrong token")(scope, receive, send)
            return
        # the whole body is read here, bounded, before any route sees it (bodies are a few
        # hundred bytes; FastAPI would turn an error raised while it reads into a 400)
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            if len(body) > MAX_BODY_BYTES:
                await _problem(413, f"body over {MAX_BODY_BYTES} bytes")(scope, receive, send)
                return
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, send)


def _problem(status_code: int, error: str, problems: list[str] | None = None) -> JSONResponse:
    body = Problem(error=error, problems=problems or [])
    return JSONResponse(body.model_dump(mode="json"), status_code=status_code)


async def _invalid_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    problems = []
    for error in exc.errors():
        # ("body", "seconds") -> "seconds"; ("query", "wait") -> "wait"
        loc = ".".join(str(p) for p in error["loc"][1:]) or str(error["loc"][0])
        problems.append(f"{loc}: {str(error['msg']).removeprefix('Value error, ')}")
    return _problem(422, "; ".join(problems) or "invalid request", problems)


async def _too_deep(request: Request, exc: Exception) -> Response:
    return _problem(400, "the body is not JSON (nested too deep)")


async def _invalid_preferences(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, PreferencesError)
    return _problem(422, str(exc), exc.problems)


def _host_name(host: str) -> str:
    """``host`` of a Host header ``host:port`` (IPv6 in brackets kept as is)."""
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


async def serve_control(
    node: NodeApi,
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
        await serve(build_app(node, token), config, task_status=task_status)  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(started)
        url = binds[0]
        write_address(data_dir, url, os.getpid())
        log.info("control API at %s", url)
        task_status.started(url)
        await trio.sleep_forever()
