from __future__ import annotations

from core.control.models import MinuteReading
from core.node.history import History

T0 = 1_800_000_000.0  # a minute boundary: 30_000_000 * 60


def test_history_per_hour_and_temperatures_survive_a_restart(tmp_path):
    db = tmp_path / "history.sqlite"
    history = History(db)
    history.record(T0, working_s=30, samples=100, gpu_temp_c=60, cpu_temp_c=None)
    history.record(T0 + 10, working_s=20, samples=50, gpu_temp_c=70, cpu_temp_c=55, gpu_util=0.9)
    history.record(T0 + 3600, working_s=60, samples=10, gpu_temp_c=None, cpu_temp_c=None)
    history.close()

    history = History(db)
    hours = history.per_hour(T0 - 1)
    assert [h.samples for h in hours] == [150, 10]
    assert hours[0].working_s == 50
    assert hours[0].gpu_temp_c_max == 70
    temps = history.per_minute(T0)
    assert temps[0] == MinuteReading(at=int(T0), gpu_temp_c=70, cpu_temp_c=55, gpu_utilization=0.9)
    assert temps[1] == MinuteReading(at=int(T0 + 3600))
    history.close()


def test_lifetime_totals_survive_restarts_and_outlive_the_minutes(tmp_path):
    db = tmp_path / "history.sqlite"
    history = History(db)
    assert history.lifetime().samples == 0
    history.record(T0, working_s=60, samples=100, gpu_temp_c=None, cpu_temp_c=None, accepted=2)
    history.close()
    history = History(db)  # a restart
    history.record(T0 + 60, working_s=30, samples=5, gpu_temp_c=None, cpu_temp_c=None, accepted=1)
    # a year and a day later: the old minutes are gone, the totals are not
    later = T0 + 367 * 86400
    history.record(later, working_s=0, samples=0, gpu_temp_c=None, cpu_temp_c=None)
    assert history.per_hour(0)[0].hour == int(later // 3600) * 3600
    lifetime = history.lifetime()
    assert (lifetime.working_s, lifetime.samples, lifetime.contributions_accepted) == (90, 105, 3)
    history.close()


def test_a_database_from_before_utilization_is_upgraded(tmp_path):
    import sqlite3

    db = tmp_path / "history.sqlite"
    old = sqlite3.connect(db)
    old.execute(
        "CREATE TABLE minutes (minute INTEGER PRIMARY KEY, working_s REAL NOT NULL,"
        " samples INTEGER NOT NULL, gpu_temp_c REAL, cpu_temp_c REAL)"
    )
    old.execute("INSERT INTO minutes VALUES (?, 60, 5, 66, 44)", (int(T0 // 60),))
    old.commit()
    old.close()
    history = History(db)
    history.record(T0 + 60, working_s=60, samples=1, gpu_temp_c=67, cpu_temp_c=45, gpu_util=0.5)
    assert history.per_minute(T0) == [
        MinuteReading(at=int(T0), gpu_temp_c=66, cpu_temp_c=44),
        MinuteReading(at=int(T0 + 60), gpu_temp_c=67, cpu_temp_c=45, gpu_utilization=0.5),
    ]
    # the totals start from the minutes the old database kept
    lifetime = history.lifetime()
    assert (lifetime.working_s, lifetime.samples, lifetime.since) == (120, 6, int(T0 // 60) * 60)
    history.close()
