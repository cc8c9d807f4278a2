"""A remote feed-forward expert beside the same module run locally, in the same run.

    python benchmarks/expert_rpc.py [--quick]

The expert (hidden 1024, inner 4096, float32) is served by a second process, as a
volunteer's node would serve it; this process times forward and forward+backward through
``RemoteExpert`` and through a local copy of the same module, at batch 64 and 512, and
the median latency of a batch-1 forward. When the comparison environment exists
(.venv-compare with ``hivemind==1.1.12``, see README), hivemind's RemoteExpert is timed on
the same module too, in a separate process (the ``hivemind_*`` keys; null otherwise).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from timing import latency_ms_median, samples_per_s

from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert
from core.experts.server import ExpertServer, ServerConfig
from core.experts.uid import ExpertUID
from core.moe.client import ExpertCaller, ExpertServerRef, Portal, RemoteExpert
from core.namespaces import moehome_validator
from net import Identity, Peer, parse_peer_addr

log = logging.getLogger("benchmarks.expert_rpc")
SPEC = ExpertSpec("ffn", hidden=1024, inner=4096)
UID = "ffn.0.0"
SEED = 7


async def _serve() -> None:
    module = build_expert(SPEC, seed=SEED)
    backend = ExpertBackend(ExpertUID.parse(UID), SPEC, module)
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(
            Peer(Identity.generate(), validator=moehome_validator()).run
        )
        await nursery.start(ExpertServer(peer, {UID: backend}, ServerConfig()).run)
        sys.stdout.write(json.dumps({"addr": peer.addrs()[0], "sha256": backend.sha256}) + "\n")
        sys.stdout.flush()
        await trio.sleep_forever()


def _workloads(module: torch.nn.Module, prefix: str) -> dict[str, tuple[Callable[[], Any], int]]:
    """name -> (one step, samples per step)."""
    out: dict[str, tuple[Callable[[], Any], int]] = {}
    for batch in (64, 512):
        x = torch.randn(batch, SPEC.hidden)

        def fwd(x: torch.Tensor = x) -> None:
            with torch.no_grad():
                module(x)

        def fwdbwd(x: torch.Tensor = x) -> None:
            xi = x.clone().requires_grad_(True)
            module(xi).sum().backward()

        out[f"{prefix}_fwd_b{batch}_sps"] = (fwd, batch)
        out[f"{prefix}_fwdbwd_b{batch}_sps"] = (fwdbwd, batch)
    return out


def _measure_interleaved(
    local: dict[str, tuple[Callable[[], Any], int]],
    remote: dict[str, tuple[Callable[[], Any], int]],
    rounds: int,
    seconds: float,
    min_reps: int,
) -> dict[str, float]:
    """Local and remote runs of each workload alternate, ``rounds`` times; the median of
    the rounds is reported, so a slow spell of the machine hits both sides alike."""
    samples: dict[str, list[float]] = {name: [] for name in [*local, *remote]}
    for _ in range(rounds):
        for (lname, (lfn, batch)), (rname, (rfn, _)) in zip(
            local.items(), remote.items(), strict=True
        ):
            samples[lname].append(samples_per_s(lfn, batch, seconds, min_reps))
            samples[rname].append(samples_per_s(rfn, batch, seconds, min_reps))
    return {name: round(statistics.median(v), 1) for name, v in samples.items()}


def _latency_ms(module: torch.nn.Module, calls: int) -> float:
    x = torch.randn(1, SPEC.hidden)
    with torch.no_grad():
        return latency_ms_median(lambda: module(x), calls)


def _hivemind(args: argparse.Namespace) -> dict[str, Any]:
    """hivemind's figures from the comparison environment, run as a separate process
    (hivemind and py-libp2p register the same protobuf package and cannot share one)."""
    python = Path(args.hivemind_python)
    keys = [
        "hivemind_fwd_b64_sps",
        "hivemind_fwdbwd_b64_sps",
        "hivemind_fwd_b512_sps",
        "hivemind_fwdbwd_b512_sps",
        "hivemind_fwd_b1_ms_median",
    ]
    if not python.exists():
        return dict.fromkeys(keys)
    script = Path(__file__).with_name("hivemind_compare.py")
    cmd = [
        str(python),
        str(script),
        "--seconds",
        str(args.seconds),
        "--latency-calls",
        str(args.latency_calls),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    if out.returncode != 0:
        log.warning("the hivemind comparison failed: %s", out.stderr.strip().splitlines()[-1:])
        return dict.fromkeys(keys)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return {k: figures.get(k) for k in keys}


async def _client(args: argparse.Namespace, where: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "benchmark": "expert_rpc",
        "hidden": SPEC.hidden,
        "inner": SPEC.inner_dim,
        "torch_threads": torch.get_num_threads(),
        "server": "separate process",
    }
    local = build_expert(SPEC, seed=SEED)
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(
            Peer(Identity.generate(), validator=moehome_validator()).run
        )
        info = parse_peer_addr(where["addr"])
        await peer.host.connect_addr(where["addr"])
        remote = RemoteExpert(
            UID,
            [ExpertServerRef(info.peer_id, where["sha256"])],
            ExpertCaller(peer.rpc, forward_timeout=60, backward_timeout=60),
            Portal.current(),
        )
        # the remote expert computes what the local copy computes
        x = torch.randn(4, SPEC.hidden)
        y_remote = await trio.to_thread.run_sync(remote, x)
        with torch.no_grad():
            torch.testing.assert_close(y_remote, local(x))
        measured = await trio.to_thread.run_sync(
            _measure_interleaved,
            _workloads(local, "local"),
            _workloads(remote, "remote"),
            args.rounds,
            args.seconds,
            args.min_reps,
        )
        result.update(measured)
        result["remote_fwd_b1_ms_median"] = await trio.to_thread.run_sync(
            _latency_ms, remote, args.latency_calls
        )
        result["local_fwd_b1_ms_median"] = _latency_ms(local, args.latency_calls)
        nursery.cancel_scope.cancel()
    for kind in ("fwd", "fwdbwd"):
        for batch in (64, 512):
            key = f"{kind}_b{batch}_sps"
            result[f"ratio_{key}"] = round(result[f"remote_{key}"] / result[f"local_{key}"], 3)
    result.update(_hivemind(args))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="short run (smoke test)")
    parser.add_argument("--seconds", type=float, default=1.5, help="time per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of local and remote")
    parser.add_argument("--min-reps", type=int, default=3)
    parser.add_argument("--latency-calls", type=int, default=300)
    parser.add_argument(
        "--hivemind-python",
        default=str(Path(__file__).resolve().parent.parent / ".venv-compare" / "bin" / "python"),
        help="python of the comparison environment with hivemind==1.1.12 (see README)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.serve:
        trio.run(_serve)
        return
    if args.quick:
        args.seconds, args.rounds, args.min_reps, args.latency_calls = 0.2, 1, 1, 20
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        where = json.loads(server.stdout.readline())
        result = trio.run(_client, args, where)
    finally:
        server.terminate()
        server.wait(timeout=10)
        if server.stdout is not None:
            server.stdout.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
