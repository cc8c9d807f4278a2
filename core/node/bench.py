"""What this device can do: matmul throughput (fp32/fp16/bf16), memory, host-device copy
speed; cached per device, driver and torch version (rerun when they change or asked)."""

from __future__ import annotations

import json
import logging
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]


def device_key() -> dict[str, str]:
    """What the cached figures depend on."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        driver = str(torch.version.cuda)
    else:
        name = platform.processor() or platform.machine()
        driver = f"cpu-threads-{torch.get_num_threads()}"
    return {"device": name, "driver": driver, "torch": torch.__version__}


def _matmul_tflops(device: torch.device, dtype: torch.dtype, size: int, seconds: float) -> float:
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    a @ b  # warm-up
    _sync(device)
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or reps < 2:
        a @ b
        reps += 1
    _sync(device)
    elapsed = time.perf_counter() - t0
    return 2 * size**3 * reps / elapsed / 1e12


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _copy_gb_s(device: torch.device, mib: int = 256) -> float | None:
    if device.type != "cuda":
        return None
    host = torch.empty(mib * 2**20, dtype=torch.uint8).pin_memory()
    host.to(device)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(4):
        host.to(device, non_blocking=True)
    torch.cuda.synchronize()
    return 4 * mib * 2**20 / (time.perf_counter() - t0) / 1e9


def run_benchmark(quick: bool = False, progress: Progress | None = None) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    size = (512 if quick else 1024) if device.type == "cpu" else (2048 if quick else 8192)
    seconds = 0.2 if quick else 1.0
    result: dict[str, Any] = {**device_key(), "device_type": device.type, "quick": quick}
    dtypes = [("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)]
    for i, (name, dtype) in enumerate(dtypes):
        if progress is not None:
            progress(f"matmul {name}", i, len(dtypes) + 1)
        try:
            result[f"matmul_tflops_{name}"] = round(_matmul_tflops(device, dtype, size, seconds), 4)
        except RuntimeError as exc:  # a dtype this device cannot multiply
            log.info("no %s matmul here: %s", name, exc)
            result[f"matmul_tflops_{name}"] = None
    if progress is not None:
        progress("memory and copies", len(dtypes), len(dtypes) + 1)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info()
        result["memory_total_gb"], result["memory_free_gb"] = (
            round(total / 1e9, 2),
            round(free / 1e9, 2),
        )
    else:
        vm = psutil.virtual_memory()
        result["memory_total_gb"], result["memory_free_gb"] = (
            round(vm.total / 1e9, 2),
            round(vm.available / 1e9, 2),
        )
    copy = _copy_gb_s(device)
    result["host_to_device_gb_s"] = round(copy, 2) if copy is not None else None
    return result


def cached_benchmark(
    cache: Path, *, force: bool = False, quick: bool = False, progress: Progress | None = None
) -> dict[str, Any]:
    """The cached figures when device, driver and torch are unchanged; else measure."""
    key = device_key()
    if cache.exists() and not force:
        try:
            saved = json.loads(cache.read_text())
            if all(saved.get(k) == v for k, v in key.items()):
                return dict(saved)
        except (OSError, ValueError):
            pass
    result = run_benchmark(quick=quick, progress=progress)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(result, indent=1))
    return result


async def network_rtt_ms(peer: Any, *, peers: int = 5, rounds: int = 5) -> dict[str, Any]:
    """Round trips to up to ``peers`` known peers (``rounds`` pings each): median and
    worst peer's median, in ms. ``peer`` is a running net.Peer that joined the swarm."""
    import statistics

    import trio

    from net import RpcError
    from net.peer import PING

    targets = list(peer.dht.known_peers())[:peers]
    medians: list[float] = []

    async def ping(target: Any) -> None:
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            try:
                await peer.rpc.call(target, PING, {}, timeout=5)
            except RpcError:
                continue
            times.append((time.perf_counter() - t0) * 1000)
        if times:
            medians.append(statistics.median(times))

    async with trio.open_nursery() as nursery:
        for target in targets:
            nursery.start_soon(ping, target)
    return {
        "network_peers": len(medians),
        "network_rtt_ms_median": round(statistics.median(medians), 2) if medians else None,
        "network_rtt_ms_worst": round(max(medians), 2) if medians else None,
    }
