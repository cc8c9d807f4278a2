"""How late the experts' contributions land (core/aggregator/stats.py): the samples of
each one a round applies are counted by how many versions old its weights were, and how
long it waited at the aggregator and since it was signed; the account reports the means
over samples, and a restart keeps them."""

from __future__ import annotations

import pytest

from core.aggregator.stats import AggregatorStatistics, load_statistics, save_statistics
from net import Identity
from tests.clocks import ManualClock
from tests.unit.test_aggregator_core import (  # the fixture closes the cores made
    UID,
    _close_cores,  # noqa: F401
    contribution,
    make_core,
    settings,
)


@pytest.mark.parametrize(
    ("applied", "lateness", "mean_late", "mean_wait", "mean_age"),
    [
        ([], None, None, None, None),  # nothing applied yet: no figures
        ([(0, 10.0, 12.0, 1)], [1], 0.0, 10.0, 12.0),
        ([(0, 10.0, 12.0, 1), (2, 20.0, 30.0, 1)], [1, 0, 1], 1.0, 15.0, 21.0),
        # weighed by samples: a small contribution moves the means little
        ([(0, 10.0, 12.0, 3), (2, 30.0, 40.0, 1)], [3, 0, 1], 0.5, 15.0, 19.0),
        # clocks that disagree (a contributor's ahead of this one) count as no time
        ([(1, 4.0, -3.0, 2)], [0, 2], 1.0, 4.0, 0.0),
    ],
)
def test_lateness_figures(applied, lateness, mean_late, mean_wait, mean_age):
    stats = AggregatorStatistics()
    for late, wait, age, samples in applied:
        stats.applied(late, wait, age, samples)
    report = stats.lateness_report()
    assert report.get("lateness") == lateness
    assert report.get("mean_versions_late") == mean_late
    assert report.get("mean_round_wait_s") == mean_wait
    assert report.get("mean_age_s") == mean_age
    again = load_statistics(save_statistics(stats))
    assert again.lateness_report() == report


def test_a_round_counts_how_late_each_contribution_it_applies_is(tmp_path):
    clock = ManualClock(epoch=float(int(ManualClock().epoch)))  # whole seconds, as signed
    core = make_core(settings(round_samples=4, staleness_bound=3), tmp_path, clock=clock)
    volunteers = [Identity.generate() for _ in range(3)]

    def signed_now(who: Identity, version: int, samples: int = 4):
        return contribution(
            core, who, version=version, samples=samples, timestamp=int(clock.wall())
        )

    # a first round: one contribution on the version it replaces, signed 5 s before
    # it reached the aggregator and 10 s before the round
    first = signed_now(volunteers[0], 0)
    clock.advance(5.0)
    core.submit(*first)
    clock.advance(5.0)
    core.run_round(UID)
    assert core.stats.lateness_report() == {
        "lateness": [4],
        "mean_versions_late": 0.0,
        "mean_round_wait_s": 5.0,
        "mean_age_s": 10.0,
    }
    # the next: 4 samples computed on version 0 (one version late), 8 on version 1
    late, on_time = signed_now(volunteers[1], 0), signed_now(volunteers[2], 1, samples=8)
    core.submit(*late)
    core.submit(*on_time)
    clock.advance(2.0)
    core.run_round(UID)
    report = core.stats.lateness_report()
    assert report["lateness"] == [4 + 8, 4]
    assert report["mean_versions_late"] == pytest.approx(4 / 16)
    assert report["mean_round_wait_s"] == pytest.approx((4 * 5.0 + 4 * 2.0 + 8 * 2.0) / 16)
    assert report["mean_age_s"] == pytest.approx((4 * 10.0 + 4 * 2.0 + 8 * 2.0) / 16)
    # what the account says survives a restart
    core.checkpoint()
    core.close()
    again = make_core(settings(round_samples=4, staleness_bound=3), tmp_path, clock=clock)
    assert again.stats.lateness_report() == report
