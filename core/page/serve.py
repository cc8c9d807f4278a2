"""``moehome owner page``: the project page written as static files, once or every
``every`` seconds, and served over HTTP from that folder if asked (Starlette's static
files on hypercorn, as the node's control API: trio, one nursery).

A refresh that fails (the swarm unreachable for a while) keeps the last page and says
why in the log; the page carries the time it was made."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.staticfiles import StaticFiles

from core.errors import UserFacingError
from core.namespaces import moehome_validator
from core.page.collect import collect_page
from core.page.render import write_page
from core.roles.peer import joined_client
from net import Identity

log = logging.getLogger(__name__)

Collect = Callable[[], Awaitable[dict[str, Any]]]


def static_app(folder: Path) -> Starlette:
    """The folder's files, ``/`` its index.html; nothing else (no listing, no writes)."""
    app = Starlette()
    app.mount("/", StaticFiles(directory=folder, html=True))
    return app


async def refresh_page(collect: Collect, folder: Path) -> Path | None:
    """One refresh: the page written from fresh data; None (the old page kept) when the
    data could not be had."""
    try:
        data = await collect()
    except (UserFacingError, OSError, trio.TooSlowError) as exc:
        log.warning("the project page was not refreshed: %s", exc)
        return None
    return write_page(data, folder)


async def serve_folder(
    folder: Path,
    bind: str,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serves ``folder`` at ``bind`` (host:port; port 0 picks one) until cancelled;
    reports the page's URL."""
    config = Config()
    config.bind = [bind]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(
            lambda task_status: serve(static_app(folder), config, task_status=task_status)  # type: ignore[arg-type]
        )
        task_status.started(binds[0] + "/")
        await trio.sleep_forever()


async def run_page(
    identity: Identity,
    project_id: str,
    bootstrap: Sequence[str],
    data_dir: Path,
    folder: Path,
    *,
    every: float | None,
    bind: str | None,
    on_ready: Callable[[Path, str | None], None],
) -> None:
    """Writes the page into ``folder``; with ``every``, again every ``every`` seconds
    until cancelled; with ``bind``, also serves the folder there. ``on_ready`` is told
    the page's path and URL once the first page is written."""
    async with joined_client(identity, bootstrap, validator=moehome_validator()) as peer:

        async def collect() -> dict[str, Any]:
            return await collect_page(peer, project_id, data_dir, bootstrap)

        page = write_page(await collect(), folder)  # the first one's errors are the user's
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_folder, folder, bind) if bind else None
            on_ready(page, url)
            if every is None and bind is None:
                return
            while True:
                await trio.sleep(every or 60.0)
                await refresh_page(collect, folder)
