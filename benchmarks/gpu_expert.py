"""What a volunteer's device does with an expert, on whatever device is present.

    python benchmarks/gpu_expert.py [--quick] [--dtype bfloat16] [--blocks 1]

Prints one JSON line:

- ``device``; ``matmul_tflops``: a dense matrix product in the project's dtype (the
  device's reference figure, same run); ``compute_dtype``: what the expert computes in
  here (a CPU computes 16-bit experts in float32: core/experts/backend.py), and where it
  differs from the project's dtype ``matmul_tflops_compute``, the same product in it;
  ``expert_vs_matmul`` is against the product in the compute dtype;
- ``expert_tflops``: a SwiGLU expert's forward+backward (hidden 4096, inner 14336:
  one Mixtral-8x7B expert; ``--blocks`` for a thick one) through ``ExpertBackend`` as a
  node serves it: the request's tensors in host memory, its graph kept, parameter
  gradients summed in float32, answers back in host memory; ``module_tflops``: the
  same module with its tensors already on the device;
- ``remote_expert_tflops``: the same expert served by a second process, called over
  libp2p on loopback (``ExpertCaller``, ``--in-flight`` requests at a time), with
  ``wire_mb_per_s`` the bytes its activations and gradients moved;
- ``params_per_gb_served`` (the project's dtype, as held on this device: float32 on a
  CPU) beside ``params_per_gb_served_fp32`` (a float32 project, same plan) and
  ``params_per_gb_before`` (the plan's 20 B per parameter before the footprint followed
  the dtype), from core/node/capacity.py; on a GPU, ``plan_peak_gb`` is what serving
  the experts planned for ``plan_budget_gb`` really took (forward with kept graph,
  backward, a swap with a graph waiting);
- ``audit_false_accusations`` over ``audits``: answers made on this device (forward and
  backward, raw and q8 on the wire), recomputed on the CPU, that exceed the honest
  bound; ``audit_max_excess`` the worst honest ratio (1 is the bound);
  ``cheats_detected`` of ``cheats``: answers scaled by 1.1 that the same audit catches;
  ``fp32_tf32_max_excess``: float32 answers with TF32 matrix products, against the
  float32 bound (why TF32 stays off: docs/decisions/011-dtypes.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.experts import activations
from core.experts.backend import ExpertBackend, compute_dtype
from core.experts.registry import DTYPES, ExpertSpec, build_expert, parameter_count
from core.experts.server import ExpertServer, ServerConfig
from core.experts.tolerance import excess
from core.experts.uid import ExpertUID
from core.moe.answer_checks import recompute_rows
from core.moe.client import ExpertCaller, ExpertServerRef
from core.namespaces import moehome_validator
from core.node.capacity import (
    FORMER_BYTES_PER_PARAM,
    GRAPH_SHARE,
    experts_that_fit,
    params_per_gb,
)
from net import Identity, Peer, parse_peer_addr

log = logging.getLogger("benchmarks.gpu_expert")
UID = "ffn.0.0"
SEED = 11


def _spec(args: argparse.Namespace) -> ExpertSpec:
    spec = ExpertSpec("swiglu", args.hidden, args.inner, 0, "silu", args.dtype)
    if args.blocks != 1:
        spec = dataclasses.replace(spec, blocks=args.blocks)
    return spec


def _sig(x: float) -> float:
    """Four significant digits (a CPU's TFLOP/s are hundredths)."""
    return float(f"{x:.4g}")


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(step: Callable[[], Any], device: torch.device, seconds: float, warmup: int = 2) -> float:
    """Seconds per step: the median of blocks of steps run for about ``seconds``."""
    for _ in range(warmup):
        step()
    _sync(device)
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 3:
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def matmul_tflops(device: torch.device, dtype: torch.dtype, n: int, seconds: float) -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    per = _timed(lambda: a @ b, device, seconds)
    return 2 * n**3 / per / 1e12


def expert_figures(
    spec: ExpertSpec, device: torch.device, rows: int, seconds: float
) -> dict[str, float]:
    """Forward+backward TFLOP/s through the serving path and of the bare module."""
    flops = 6 * rows * parameter_count(spec)
    backend = ExpertBackend(
        ExpertUID.parse(UID),
        spec,
        build_expert(spec, seed=SEED),
        device=device,
        max_batch_size=rows,
        graph_cache_bytes=1 << 40,
    )
    x = torch.randn(rows, spec.hidden).to(spec.torch_dtype)
    g = (torch.randn(rows, spec.hidden) * 1e-2).to(spec.torch_dtype)

    def served() -> None:
        _, handle = backend.forward(x, keep=True, owner="bench")
        assert handle is not None
        backend.backward_kept("bench", handle, g)

    module = backend.module
    xd, gd = backend._in(x), backend._in(g)  # as the serving path holds them

    def bare() -> None:
        xi = xd.detach().requires_grad_(True)
        torch.autograd.backward(module(xi), gd)
        module.zero_grad(set_to_none=True)

    served_s = _timed(served, device, seconds)
    bare_s = _timed(bare, device, seconds)
    backend.accumulator.take_all()
    return {
        "expert_tflops": _sig(flops / served_s / 1e12),
        "module_tflops": _sig(flops / bare_s / 1e12),
        "expert_ms": round(served_s * 1e3, 2),
    }


# ---------------------------------------------------------------- remote, over loopback


async def _serve(args: argparse.Namespace) -> None:
    spec = _spec(args)
    backend = ExpertBackend(
        ExpertUID.parse(UID),
        spec,
        build_expert(spec, seed=SEED),
        device=_device(),
        max_batch_size=args.rows,
        graph_cache_bytes=1 << 40,
    )
    config = ServerConfig(max_batch_size=args.rows * args.in_flight)
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(
            Peer(Identity.generate(), validator=moehome_validator()).run
        )
        await nursery.start(ExpertServer(peer, {UID: backend}, config).run)
        sys.stdout.write(json.dumps({"addr": peer.addrs()[0]}) + "\n")
        sys.stdout.flush()
        await trio.sleep_forever()


async def _remote(args: argparse.Namespace, addr: str) -> dict[str, float]:
    spec = _spec(args)
    flops = 6 * args.rows * parameter_count(spec)
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(
            Peer(Identity.generate(), validator=moehome_validator()).run
        )
        info = parse_peer_addr(addr)
        await peer.host.connect_addr(addr)
        caller = ExpertCaller(
            peer.rpc,
            forward_timeout=120,
            backward_timeout=120,
            codecs=activations.WireCodecs(args.wire, args.wire),
            dtype=spec.torch_dtype,
        )
        ref = [ExpertServerRef(info.peer_id)]
        x = torch.randn(args.rows, spec.hidden).to(spec.torch_dtype)
        g = (torch.randn(args.rows, spec.hidden) * 1e-2).to(spec.torch_dtype)

        async def step() -> None:
            kept = await caller.forward(UID, ref, x, keep=True)
            await caller.backward(UID, ref, x, g, kept=kept)

        await step()  # warm: connection, allocator
        done = 0
        start = trio.current_time()
        deadline = start + args.seconds * 2

        async def worker() -> None:
            nonlocal done
            while trio.current_time() < deadline or done < args.in_flight:
                await step()
                done += 1

        bytes_before = caller.stats.wire_bytes
        async with trio.open_nursery() as workers:
            for _ in range(args.in_flight):
                workers.start_soon(worker)
        elapsed = trio.current_time() - start
        moved = caller.stats.wire_bytes - bytes_before
        nursery.cancel_scope.cancel()
    # the answers' bytes are not counted by the caller's statistics: as many as sent
    return {
        "remote_expert_tflops": _sig(done * flops / elapsed / 1e12),
        "remote_steps": done,
        "wire_mb_per_s": round(2 * moved / elapsed / 1e6, 1),
    }


def remote_figures(args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--serve", *_passed(args)]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        addr = json.loads(line)["addr"]
        return trio.run(_remote, args, addr)
    finally:
        server.kill()
        server.wait()


def _passed(args: argparse.Namespace) -> list[str]:
    return [
        f"--dtype={args.dtype}",
        f"--hidden={args.hidden}",
        f"--inner={args.inner}",
        f"--blocks={args.blocks}",
        f"--rows={args.rows}",
        f"--in-flight={args.in_flight}",
    ]


# ---------------------------------------------------------------- memory


def memory_figures(spec: ExpertSpec, device: torch.device, budget_gb: float) -> dict[str, Any]:
    # the weights as a node holds them here (core/node/serving.py's plan does the same)
    itemsize = compute_dtype(spec.torch_dtype, device).itemsize
    on_gpu = device.type == "cuda"
    out: dict[str, Any] = {
        "params_per_gb_served": round(params_per_gb(itemsize, on_gpu=on_gpu) / 1e6, 2),
        "params_per_gb_served_fp32": round(params_per_gb(4, on_gpu=on_gpu) / 1e6, 2),
        "params_per_gb_before": round(1e9 * (1 - GRAPH_SHARE) / FORMER_BYTES_PER_PARAM / 1e6, 2),
        "params_unit": "millions",
    }
    if not on_gpu:
        return out
    out.update(planned_peak(spec, device, int(budget_gb * 1e9)))
    return out


def planned_peak(spec: ExpertSpec, device: torch.device, budget: int) -> dict[str, Any]:
    """Serve as many experts as the plan fits in ``budget``, each through a forward
    pass with its graph kept (at the plan's share of graphs), a backward pass, a swap
    of weights while a graph waits on the old ones and a backward pass on them; the
    peak of what torch allocated meanwhile."""
    from core.node.capacity import graph_cache_bytes

    params = parameter_count(spec)
    n = experts_that_fit(params, spec.torch_dtype.itemsize, budget, None, on_gpu=True)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    graph_bytes = graph_cache_bytes(budget, max(n, 1))
    backends = [
        ExpertBackend(
            ExpertUID.parse(f"ffn.0.{i}"),
            spec,
            build_expert(spec, seed=i),
            device=device,
            graph_cache_bytes=graph_bytes,
        )
        for i in range(n)
    ]
    # rows whose kept graph fills what one trainer may keep
    width = spec.kept_widths() * spec.hidden * spec.torch_dtype.itemsize
    # (one owner may hold half of an expert's share: core/experts/backend.py GraphCache)
    rows = max(1, min(4096, int(graph_bytes // 2 // width) - 1))
    x = torch.randn(rows, spec.hidden).to(spec.torch_dtype)
    for b in backends:
        _, handle = b.forward(x, keep=True, owner="t")
        b.backward(x, x)
        if handle is not None:
            b.replace_weights(build_expert(spec, seed=99), version=1)
            b.backward_kept("t", handle, x)
        b.accumulators()
    _sync(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del backends
    torch.cuda.empty_cache()
    return {
        "plan_budget_gb": round(budget / 1e9, 2),
        "plan_experts": n,
        "plan_expert_params_m": round(params / 1e6, 1),
        "plan_peak_gb": round(peak / 1e9, 3),
    }


# ---------------------------------------------------------------- audits


def audit_figures(
    spec: ExpertSpec, device: torch.device, audits: int, cheats: int
) -> dict[str, Any]:
    """Answers made on ``device``, audited on the CPU as a trainer or aggregator does."""
    gen = torch.Generator().manual_seed(5)
    module = build_expert(spec, seed=SEED)
    backend = ExpertBackend(ExpertUID.parse(UID), spec, module, device=device)
    reference = build_expert(spec, seed=SEED)  # the published weights, on the CPU
    worst, false, caught = 0.0, 0, 0
    codecs = ["raw", "q8"]
    for i in range(audits + cheats):
        rows = int(torch.randint(1, 33, (1,), generator=gen))
        x = torch.randn(rows, spec.hidden, generator=gen).to(spec.torch_dtype)
        kind: Literal["forward", "backward"] = "forward" if i % 2 == 0 else "backward"
        codec = codecs[(i // 2) % len(codecs)]
        if kind == "forward":
            answer, _ = backend.forward(x)
            grad = None
        else:
            grad = (torch.randn(rows, spec.hidden, generator=gen) * 1e-2).to(spec.torch_dtype)
            answer = backend.input_gradients(x, grad)
        if i >= audits:
            answer = answer * 1.1  # a cheat: the answer scaled
        claimed = activations.roundtrip(answer, codec)
        expected = recompute_rows(reference, kind, x, grad, spec.torch_dtype)
        over = excess(claimed, expected, codec, spec.torch_dtype)
        if i < audits:
            worst = max(worst, over)
            false += over > 1
        else:
            caught += over > 1
    return {
        "audits": audits,
        "audit_false_accusations": false,
        "audit_max_excess": round(worst, 4),
        "cheats": cheats,
        "cheats_detected": caught,
    }


def tf32_excess(spec: ExpertSpec, device: torch.device, answers: int) -> float | None:
    """The worst excess of float32 answers computed with TF32 matrix products, against
    the float32 bound (None without CUDA)."""
    if device.type != "cuda":
        return None
    fp32 = dataclasses.replace(spec, dtype="float32")
    module = build_expert(fp32, seed=SEED).to(device)
    reference = build_expert(fp32, seed=SEED)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        worst = 0.0
        for _ in range(answers):
            x = torch.randn(16, spec.hidden)
            with torch.no_grad():
                y = module(x.to(device)).cpu()
            expected = recompute_rows(reference, "forward", x, None, torch.float32)
            worst = max(worst, excess(y, expected, "raw", torch.float32))
        return round(worst, 3)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="small sizes (CPU, smoke test)")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--inner", type=int, default=14336)
    parser.add_argument("--blocks", type=int, default=1)
    parser.add_argument("--rows", type=int, default=2048, help="rows per request")
    parser.add_argument("--in-flight", type=int, default=4, help="remote requests at a time")
    parser.add_argument("--wire", default="raw", help="activation codec on the wire")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    parser.add_argument("--audits", type=int, default=1000)
    parser.add_argument("--cheats", type=int, default=100)
    parser.add_argument("--audit-hidden", type=int, default=1024)
    parser.add_argument("--plan-budget-gb", type=float, default=8.0)
    parser.add_argument("--no-remote", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.quick:
        args.hidden, args.inner, args.rows = 256, 896, 64
        args.seconds, args.audits, args.cheats, args.audit_hidden = 0.3, 40, 10, 128
    if args.serve:
        trio.run(_serve, args)
        return
    device = _device()
    spec = _spec(args)
    dtype = spec.torch_dtype
    result: dict[str, Any] = {
        "benchmark": "gpu_expert",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        "torch": torch.__version__,
        "dtype": args.dtype,
        "hidden": spec.hidden,
        "inner": spec.inner_dim,
        "blocks": args.blocks,
        "rows": args.rows,
        "expert_params_m": round(parameter_count(spec) / 1e6, 1),
    }
    n = 8192 if device.type == "cuda" else (256 if args.quick else 1024)
    result["matmul_tflops"] = _sig(matmul_tflops(device, dtype, n, args.seconds))
    computes_in = compute_dtype(dtype, device)
    result["compute_dtype"] = str(computes_in).removeprefix("torch.")
    reference = result["matmul_tflops"]
    if computes_in != dtype:
        reference = result["matmul_tflops_compute"] = _sig(
            matmul_tflops(device, computes_in, n, args.seconds)
        )
    result.update(expert_figures(spec, device, args.rows, args.seconds))
    result["expert_vs_matmul"] = round(result["expert_tflops"] / reference, 3)
    if not args.no_remote:
        result.update(remote_figures(args))
        result["remote_vs_local"] = round(
            result["remote_expert_tflops"] / result["expert_tflops"], 3
        )
    result.update(memory_figures(spec, device, args.plan_budget_gb))
    result["ratio_vs_fp32"] = round(
        result["params_per_gb_served"] / result["params_per_gb_served_fp32"], 2
    )
    result["ratio_vs_before"] = round(
        result["params_per_gb_served"] / result["params_per_gb_before"], 2
    )
    small = dataclasses.replace(spec, hidden=args.audit_hidden, inner=args.audit_hidden * 7 // 2)
    result.update(audit_figures(small, device, args.audits, args.cheats))
    result["fp32_tf32_max_excess"] = tf32_excess(small, device, 20)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
