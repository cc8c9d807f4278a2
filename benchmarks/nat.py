"""Peers behind NAT in the network lab (root only): how many a caller can reach, how many
end on a direct connection after hole punching, how fast the first answer comes and
how fast bytes go, beside two peers on the public network in the same run.

    sudo python benchmarks/nat.py [--trials 20] [--uplink-mbit 20]

Each trial starts a fresh volunteer (`moehome peer`, new identity and port) in home
"a" and a fresh caller in home "b" (both cone NATs that keep ports): the volunteer learns
it cannot be dialled, takes two relay reservations and announces them; the caller,
given only those relayed addresses, connects, times its first answer (through the
relay), waits for hole punching to make the connection direct and times 4 MiB over it.
A few more trials put the caller behind a symmetric NAT (home "c"), where punching
fails: they time 4 MiB through the relay. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from net.testing.lab import Home, LabHost, missing_requirements, network_lab  # noqa: E402
from tests.child_processes import stop_processes  # noqa: E402
from tests.nat.probes import Lines, start_peer  # noqa: E402

PAYLOAD = 4 * 1024 * 1024


def wait_json(lines: Lines, key: str, test: Any, timeout: float) -> dict[str, Any]:
    line = lines.wait_for(
        lambda line: line.startswith("{") and key in json.loads(line) and test(json.loads(line)),
        timeout,
    )
    result: dict[str, Any] = json.loads(line)
    return result


def call(host: LabHost, peer: str, addrs: list[str], *extra: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tests.nat.caller", peer, *addrs, "--bytes", str(PAYLOAD)]
    done = subprocess.run(
        host.command([*cmd, *extra]), cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    if done.returncode != 0:
        return {"connected": False, "error": done.stderr[-300:]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--symmetric-trials", type=int, default=5)
    parser.add_argument("--uplink-mbit", type=float, default=20.0)
    args = parser.parse_args()
    missing = missing_requirements()
    if missing:
        sys.exit(f"the network lab cannot run here: {missing}")
    uplink = args.uplink_mbit or None
    homes = [Home("a", uplink_mbit=uplink), Home("b", uplink_mbit=uplink)]
    homes.append(Home("c", nat="symmetric", uplink_mbit=uplink))
    trials: list[dict[str, Any]] = []
    with network_lab(["boot", "r2", "pub1", "pub2"], homes) as lab:
        procs: list[Any] = []
        try:
            boot, _, boot_addr = start_peer(lab.host("boot"), [])
            procs.append(boot)
            r2, r2_lines, _ = start_peer(lab.host("r2"), [boot_addr])
            procs.append(r2)
            wait_json(r2_lines, "reachability", lambda j: j["reachability"] == "public", 60)

            # the reference: two peers on the public network
            pub, _, pub_addr = start_peer(lab.host("pub1"), [boot_addr])
            procs.append(pub)
            reference = call(lab.host("pub2"), pub_addr.rsplit("/p2p/", 1)[1], [pub_addr])

            for i in range(args.trials + args.symmetric_trials):
                symmetric = i >= args.trials
                caller_home = "c/0" if symmetric else "b/0"
                port = 5000 + i
                started = time.monotonic()
                volunteer, lines, addr = start_peer(lab.host("a/0"), [boot_addr], port)
                trial: dict[str, Any] = {"symmetric": symmetric}
                try:
                    announced = wait_json(
                        lines, "relayed_addrs", lambda j: len(j["relayed_addrs"]) == 2, 90
                    )
                    trial["relayed_after_start_s"] = round(time.monotonic() - started, 2)
                    trial.update(
                        call(
                            lab.host(caller_home),
                            addr.rsplit("/p2p/", 1)[1],
                            announced["relayed_addrs"],
                            "--bootstrap",
                            boot_addr,
                            "--direct-within",
                            "20",
                        )
                    )
                except Exception as exc:  # noqa: BLE001 - a failed trial is counted, not fatal
                    trial.update({"connected": False, "error": repr(exc)[:300]})
                finally:
                    stop_processes([volunteer])
                trials.append(trial)
                print(json.dumps({"trial": i, **trial}), file=sys.stderr, flush=True)
        finally:
            stop_processes(procs)

    cone = [t for t in trials if not t["symmetric"]]
    sym = [t for t in trials if t["symmetric"]]
    reached = [t for t in trials if t.get("connected")]
    direct = [t for t in cone if t.get("final_kind") == "direct"]
    line = {
        "benchmark": "nat",
        "trials": len(cone),
        "symmetric_trials": len(sym),
        "uplink_mbit": uplink,
        "reachable_share": round(len(reached) / len(trials), 3) if trials else None,
        "direct_share": round(len(direct) / len(cone), 3) if cone else None,
        "direct_share_symmetric": (
            round(sum(t.get("final_kind") == "direct" for t in sym) / len(sym), 3) if sym else None
        ),
        "first_answer_s_relayed_median": median(
            [t["first_answer_s"] for t in reached if t.get("first_kind") == "relayed"]
        ),
        "first_answer_s_direct_median": median(
            [t["first_answer_s"] + t["direct_after_s"] for t in direct if "direct_after_s" in t]
        ),
        "direct_after_s_median": median([t["direct_after_s"] for t in direct]),
        "relayed_mb_s": median(
            [t["mb_s"] for t in sym if t.get("final_kind") == "relayed" and "mb_s" in t]
        ),
        "direct_mb_s": median([t["mb_s"] for t in direct if "mb_s" in t]),
        "reference_public_pair": {
            "first_answer_s": reference.get("first_answer_s"),
            "mb_s": reference.get("mb_s"),
            "kind": reference.get("final_kind"),
        },
        "failures": [t.get("error") for t in trials if not t.get("connected")][:5],
        # connected, but a call failed afterwards (the 4 MiB one, say)
        "call_failures": sum(1 for t in reached if t.get("error")),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
