"""The emulated swarm's DHT figures: hosts' files summed, per volunteer and second."""

from __future__ import annotations

import json
from pathlib import Path

from core.demo.emulated import dht_rates, volunteers_dht


def host_file(path: Path, peers: int, seconds: float, sent: int, version_gets: int) -> Path:
    path.write_text(
        json.dumps(
            {
                "peers": peers,
                "seconds": seconds,
                "queries_failed": 0,
                "sent_by_method": {"dht.get": sent},
                "served_by_method": {"dht.get": sent},
                "gets_by_namespace": {"version": version_gets},
                "puts_by_namespace": {},
            }
        )
    )
    return path


def test_hosts_are_weighed_by_their_volunteers_and_seconds_and_a_missing_one_is_left_out(
    tmp_path,
):
    a = host_file(tmp_path / "a.json", peers=8, seconds=100.0, sent=4000, version_gets=800)
    b = host_file(tmp_path / "b.json", peers=2, seconds=50.0, sent=1000, version_gets=100)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    rates = volunteers_dht([a, b, broken, tmp_path / "missing.json"])
    # 5,000 requests over 8 x 100 + 2 x 50 = 900 volunteer-seconds
    assert rates["sent_per_s"] == round(5000 / 900, 3)
    assert rates["sent_by_method_per_s"] == {"get": round(5000 / 900, 3)}
    assert rates["gets_per_s"] == {"version": 1.0}
    assert rates["failed_per_s"] == 0


def test_no_seconds_no_rates():
    assert dht_rates({"sent_by_method": {"dht.get": 5}}, 0.0) == {}
    assert volunteers_dht([]) == {}
