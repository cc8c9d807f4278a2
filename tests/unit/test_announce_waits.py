"""When the owner announces its project again (core/project/publish.py)."""

from __future__ import annotations

from itertools import islice

import pytest

from core.project.publish import FIRST_REANNOUNCE_S, announce_waits


@pytest.mark.parametrize(
    ("refresh", "first", "waits"),
    [
        # soon after publishing, when the swarm grows most, then every refresh
        (600.0, 10.0, [10, 20, 40, 80, 160, 320, 600, 600]),
        (100.0, 10.0, [10, 20, 40, 80, 100, 100, 100, 100]),
        # a refresh shorter than the first wait: every refresh from the start
        (5.0, 10.0, [5, 5, 5, 5, 5, 5, 5, 5]),
        (600.0, 600.0, [600] * 8),
    ],
)
def test_announcements_come_soon_after_publishing_then_every_refresh(
    refresh: float, first: float, waits: list[float]
) -> None:
    assert list(islice(announce_waits(refresh, first), 8)) == waits


def test_by_default_the_first_comes_within_a_demo_run() -> None:
    # the demo's volunteers join within ~30 s of publishing; its page is made ~60 s later
    assert next(announce_waits(600.0)) == FIRST_REANNOUNCE_S <= 15
