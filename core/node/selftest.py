"""`moehome node --selftest`: what a fresh install (or the built bundle) must be able to
do, checked in seconds without a network: say the device it computes on (and a GPU it
cannot use), measure the device (quick), start two libp2p hosts on loopback that call
each other and stop, run an expert forward on that device, and read the machine's
probes. Each check reports ok or the error; nothing is kept."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


def _compute_device() -> str:
    from core.node.compute_device import decide, this_machine

    # a GPU left unused is said, not failed: a CPU install on a GPU machine still works
    compute = decide(this_machine(), "all")
    return f"{compute.line}; {compute.warning}" if compute.warning else compute.line


def _benchmark() -> str:
    from core.node.bench import run_benchmark

    figures = run_benchmark(quick=True)
    fp32 = figures.get("matmul_tflops_fp32")
    if not fp32 or fp32 <= 0:
        raise RuntimeError(f"no fp32 matmul figure: {figures}")
    return f"{figures['device_type']} fp32 {fp32} TFLOPS, {figures['memory_total_gb']} GB"


async def _hosts() -> str:
    import trio

    from net import Identity, Peer, PeerConfig
    from net.peer import PING

    config = PeerConfig(listen=("/ip4/127.0.0.1/tcp/0",))
    async with trio.open_nursery() as nursery:
        a: Peer = await nursery.start(Peer(Identity.generate(), config).run)
        b: Peer = await nursery.start(Peer(Identity.generate(), config).run)
        await b.host.connect_addr(a.addrs()[0])
        t0 = time.perf_counter()
        await b.rpc.call(a.peer_id, PING, {}, timeout=10)
        rtt = (time.perf_counter() - t0) * 1000
        nursery.cancel_scope.cancel()
    return f"two hosts on loopback, ping {rtt:.1f} ms, stopped"


def _expert() -> str:
    import torch

    from core.experts.backend import ExpertBackend
    from core.experts.registry import ExpertSpec, build_expert
    from core.experts.uid import ExpertUID
    from core.node.compute_device import decide, this_machine

    # on the device the node would serve on: a GPU build's kernels are checked too
    compute = decide(this_machine(), "all")
    spec = ExpertSpec("ffn", hidden=64, inner=256)
    backend = ExpertBackend(
        ExpertUID.parse("ffn.0.0"), spec, build_expert(spec, seed=0), device=compute.device
    )
    out, _ = backend.forward(torch.randn(8, 64))
    if tuple(out.shape) != (8, 64) or not bool(torch.isfinite(out).all()):
        raise RuntimeError(f"bad expert output: shape {tuple(out.shape)}")
    return f"ffn expert forward [8, 64] on the {compute.line}"


def _probes() -> str:
    from core.node.probes import probe_for_this_os

    reading = probe_for_this_os().read()
    return (
        f"idle {reading.idle_seconds}, GPU {reading.gpu_temp_c} °C, "
        f"CPU {reading.cpu_temp_c} °C, battery {reading.on_battery}"
    )


async def run_selftest(report: Callable[[str, bool, str], None]) -> bool:
    """Run every check; ``report(name, ok, detail)`` after each. True when all passed."""
    import trio

    checks: list[tuple[str, Callable[[], Awaitable[str]]]] = [
        ("compute device", lambda: trio.to_thread.run_sync(_compute_device)),
        ("device benchmark", lambda: trio.to_thread.run_sync(_benchmark)),
        ("libp2p hosts", _hosts),
        ("expert forward", lambda: trio.to_thread.run_sync(_expert)),
        ("probes", lambda: trio.to_thread.run_sync(_probes)),
    ]
    all_ok = True
    for name, check in checks:
        try:
            with trio.fail_after(120):
                detail = await check()
            report(name, True, detail)
        except Exception as exc:
            log.debug("selftest %s failed", name, exc_info=True)
            report(name, False, f"{type(exc).__name__}: {exc}")
            all_ok = False
    return all_ok
