from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.bundle.building import BUNDLE_BUILD, BUNDLE_TESTS, BundleBuild, prebuilt_bundle

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

#: the whole suite's grouping and order on two workers (make test)
pytest_plugins = ["tests.parallel"]


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what they will
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The bundle's test goes last, and when other tests run before it, its build
    starts now, at the lowest priority, to use the CPU time they leave idle (none when
    MOEHOME_BUNDLE names one built before). On workers of ``pytest -n`` the bundle's
    test goes first instead and builds in the foreground, the other worker running
    tests meanwhile (tests/parallel.py)."""
    if hasattr(config, "workerinput"):  # a worker of pytest -n (tests.parallel.in_a_worker)
        return
    bundle = [item for item in items if item.nodeid.startswith(BUNDLE_TESTS)]
    if not bundle or len(bundle) == len(items) or config.option.collectonly:
        return
    if prebuilt_bundle() is not None:
        return
    items[:] = [item for item in items if item not in bundle] + bundle
    build = BundleBuild.start(background=True)
    config.stash[BUNDLE_BUILD] = build
    config.add_cleanup(build.remove)


@pytest.fixture(autouse=True)
def _bundle_build_stopped_beside_slow_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    """A slow test (many processes, rates, routing) has the machine to itself: the
    background bundle build waits meanwhile (tests/bundle/building.py)."""
    build = request.config.stash.get(BUNDLE_BUILD, None)
    stop = (
        build is not None
        and request.node.get_closest_marker("slow") is not None
        and not request.node.nodeid.startswith(BUNDLE_TESTS)
    )
    if build is not None and stop:
        build.pause()
    try:
        yield
    finally:
        if build is not None and stop:
            build.resume()


@pytest.fixture(autouse=True)
def _private_data_dir(tmp_path, monkeypatch):
    """Never touch the real user's data or config folders."""
    monkeypatch.setenv("MOEHOME_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MOEHOME_CONFIG_DIR", str(tmp_path / "config"))


@pytest.fixture(autouse=True)
def _restore_logging():
    """CLI tests configure logging for the whole process; undo it after each test."""
    import logging

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    levels = {name: logging.getLogger(name).level for name in ("app", "core", "net", "libp2p")}
    yield
    root.handlers[:], root.level = saved[0], saved[1]
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


# Property tests run the same examples every time (no example database, no random seed,
# no "explain" phase, whose tracing misbehaved on a loaded machine): a failure in CI is
# then reproducible by running the test again.
from hypothesis import Phase, settings  # noqa: E402

settings.register_profile(
    "moehome",
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)
settings.load_profile("moehome")
