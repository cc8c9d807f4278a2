"""What volunteers like to look at later: work done per hour and temperatures over time,
in a small SQLite database in the user's data folder (bounded: a year of minutes)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from core.control.models import HourOfWork, Lifetime, MinuteReading

_SCHEMA = """
CREATE TABLE IF NOT EXISTS minutes (
    minute INTEGER PRIMARY KEY,   -- unix time // 60
    working_s REAL NOT NULL,      -- seconds of the minute spent allowed to work
    samples INTEGER NOT NULL,     -- samples computed (forward + backward)
    gpu_temp_c REAL,              -- the hottest reading of the minute
    cpu_temp_c REAL,
    gpu_util REAL                 -- the highest GPU utilization of the minute, 0..1
);
-- everything since the first start: minutes go after a year, the totals stay
CREATE TABLE IF NOT EXISTS totals (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    working_s REAL NOT NULL,
    samples INTEGER NOT NULL,
    accepted INTEGER NOT NULL,
    since REAL NOT NULL           -- unix time of the first record
);
"""
_KEEP_MINUTES = 366 * 24 * 60


class History:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock, self._db:
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(minutes)")}
            if "gpu_util" not in columns:  # a database from before utilization was kept
                self._db.execute("ALTER TABLE minutes ADD COLUMN gpu_util REAL")
            # a database from before the totals: they start from the minutes it kept
            self._db.execute(
                """INSERT OR IGNORE INTO totals
                   SELECT 1, coalesce(sum(working_s), 0), coalesce(sum(samples), 0), 0,
                          coalesce(min(minute) * 60, ?)
                   FROM minutes""",
                (time.time(),),
            )

    def record(
        self,
        now: float,
        *,
        working_s: float,
        samples: int,
        gpu_temp_c: float | None,
        cpu_temp_c: float | None,
        gpu_util: float | None = None,
        accepted: int = 0,
    ) -> None:
        minute = int(now // 60)
        with self._lock, self._db:
            self._db.execute(
                "UPDATE totals SET working_s = working_s + ?, samples = samples + ?, "
                "accepted = accepted + ? WHERE id = 1",
                (working_s, samples, accepted),
            )
            self._db.execute(
                """INSERT INTO minutes VALUES (?, ?, ?, ?, ?, ?)
                   ON CONFLICT(minute) DO UPDATE SET
                     working_s = working_s + excluded.working_s,
                     samples = samples + excluded.samples,
                     gpu_temp_c = max(coalesce(gpu_temp_c, excluded.gpu_temp_c),
                                      coalesce(excluded.gpu_temp_c, gpu_temp_c)),
                     cpu_temp_c = max(coalesce(cpu_temp_c, excluded.cpu_temp_c),
                                      coalesce(excluded.cpu_temp_c, cpu_temp_c)),
                     gpu_util = max(coalesce(gpu_util, excluded.gpu_util),
                                    coalesce(excluded.gpu_util, gpu_util))""",
                (minute, working_s, samples, gpu_temp_c, cpu_temp_c, gpu_util),
            )
            self._db.execute("DELETE FROM minutes WHERE minute < ?", (minute - _KEEP_MINUTES,))

    def per_hour(self, since: float) -> list[HourOfWork]:
        with self._lock:
            rows = self._db.execute(
                """SELECT minute / 60, sum(working_s), sum(samples),
                          max(gpu_temp_c), max(cpu_temp_c)
                   FROM minutes WHERE minute >= ? GROUP BY minute / 60 ORDER BY 1""",
                (int(since // 60),),
            ).fetchall()
        return [
            HourOfWork(hour=h * 3600, working_s=w, samples=s, gpu_temp_c_max=g, cpu_temp_c_max=c)
            for h, w, s, g, c in rows
        ]

    def per_minute(self, since: float) -> list[MinuteReading]:
        """Per minute: the hottest GPU and CPU (°C) and the highest GPU use (0..1)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT minute * 60, gpu_temp_c, cpu_temp_c, gpu_util FROM minutes "
                "WHERE minute >= ? ORDER BY 1",
                (int(since // 60),),
            ).fetchall()
        return [
            MinuteReading(at=int(t), gpu_temp_c=g, cpu_temp_c=c, gpu_utilization=u)
            for t, g, c, u in rows
        ]

    def lifetime(self) -> Lifetime:
        """Everything this computer gave since its first start (survives restarts)."""
        with self._lock:
            row = self._db.execute(
                "SELECT working_s, samples, accepted, since FROM totals WHERE id = 1"
            ).fetchone()
        working_s, samples, accepted, since = row
        return Lifetime(
            working_s=working_s, samples=samples, contributions_accepted=accepted, since=since
        )

    def close(self) -> None:
        with self._lock:
            self._db.close()
