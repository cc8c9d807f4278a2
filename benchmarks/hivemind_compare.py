"""hivemind 1.1.12's RemoteExpert on the same expert module as benchmarks/expert_rpc.py.

    .venv-compare/bin/python benchmarks/hivemind_compare.py [--quick]

Needs the comparison environment (``hivemind==1.1.12`` with its p2pd binary); the main
environment has no hivemind, so hivemind is imported only inside ``measure_hivemind``.
The module is served by hivemind's own machinery in a background process
(``_server_runner`` as in ``background_server`` -> ``Server.create`` -> ``ModuleBackend``
+ ``Runtime`` + ``ConnectionHandler`` processes, over its own p2pd daemon on loopback) and
called through hivemind's ``RemoteExpert`` in this process. Prints one JSON line.

hivemind and py-libp2p 0.8.1 both register protobuf package ``crypto.pb`` (different
``crypto.proto`` files) in protobuf's default descriptor pool, so hivemind cannot be
imported in a process that has imported ``net`` (libp2p), in either order: call
``measure_hivemind`` from a process that has not, e.g. run this file as a subprocess.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import latency_ms_median, samples_per_s

UID = "ffn.0.0"
_EXPERT_CLS = "moehome_bench"  # the name the server process registers the module under


def _latency_ms(module: Callable[[torch.Tensor], Any], hidden: int, calls: int) -> float:
    x = torch.randn(1, hidden)
    with torch.no_grad():
        return latency_ms_median(lambda: module(x), calls)


def _sample_input(batch: int, hidden: int) -> torch.Tensor:
    return torch.empty(batch, hidden)


def _serve(
    pipe: Connection,
    module_factory: Callable[[], torch.nn.Module],
    hidden: int,
    server_kwargs: dict[str, Any],
) -> None:
    """The server process: hivemind's own ``_server_runner`` (what ``background_server``
    runs), after registering the expert class, which ``Server.create`` builds as
    ``name_to_block[expert_cls](hidden_dim)``."""
    from hivemind.moe.server import register_expert_class
    from hivemind.moe.server.server import _server_runner

    def block(hidden_dim: int) -> torch.nn.Module:
        assert hidden_dim == hidden
        return module_factory()

    register_expert_class(_EXPERT_CLS, _sample_input)(block)
    _server_runner(pipe, expert_cls=_EXPERT_CLS, hidden_dim=hidden, **server_kwargs)


@contextmanager
def _background_server(
    module_factory: Callable[[], torch.nn.Module],
    hidden: int,
    server_kwargs: dict[str, Any],
    start_timeout: float = 120,
    shutdown_timeout: float = 30,
) -> Iterator[Any]:
    """hivemind's ``background_server``, but the process is spawned rather than forked: a
    forked child hangs in its first torch op (ModuleBackend's dummy forward) when the
    parent has already run torch's intra-op thread pool. Yields hivemind's PeerInfo."""
    ctx = mp.get_context("spawn")
    pipe, runner_pipe = ctx.Pipe(duplex=True)
    runner = ctx.Process(target=_serve, args=(runner_pipe, module_factory, hidden, server_kwargs))
    runner.start()
    try:
        if not pipe.poll(start_timeout):
            raise TimeoutError(f"hivemind server not ready in {start_timeout} s")
        start_ok, data = pipe.recv()
        if not start_ok:
            raise RuntimeError(f"hivemind server failed to start: {data}")
        yield data
    finally:
        if runner.is_alive():
            with suppress(OSError):
                pipe.send("SHUTDOWN")
        runner.join(timeout=shutdown_timeout)
        if runner.is_alive():
            runner.kill()
            runner.join()
        pipe.close()


def measure_hivemind(
    module_factory: Callable[[], torch.nn.Module],
    hidden: int,
    batches: Sequence[int] = (64, 512),
    seconds: float = 1.5,
    min_reps: int = 3,
    latency_calls: int = 300,
) -> dict[str, float]:
    """Samples/s of forward and forward+backward through hivemind's RemoteExpert at each
    batch size, and the median batch-1 forward latency in ms.

    The server builds its module with ``module_factory()`` (same architecture and weights
    as the caller's) and steps SGD with lr=0 after each backward, as ModuleBackend does,
    so the weights never change; outputs are checked against a local copy before and after.
    The server process is spawned, so ``module_factory`` must be picklable (a module-level
    function or a ``functools.partial`` of one) and a calling script needs the usual
    ``if __name__ == "__main__":`` guard.
    """
    from hivemind import DHT
    from hivemind.moe.client.expert import create_remote_experts
    from hivemind.moe.client.remote_expert_worker import RemoteExpertWorker
    from hivemind.moe.expert_uid import ExpertInfo

    local = module_factory()
    check = torch.randn(4, hidden)
    with torch.no_grad():
        expected = local(check)
    server_kwargs: dict[str, Any] = {
        "expert_uids": [UID],
        "optim_cls": functools.partial(torch.optim.SGD, lr=0.0),
        "device": "cpu",
        "max_batch_size": max(4096, *batches),
    }

    result: dict[str, float] = {}
    with _background_server(module_factory, hidden, server_kwargs) as server_info:
        dht = DHT(initial_peers=server_info.addrs, client_mode=True, start=True)
        expert = None
        try:
            expert = create_remote_experts([ExpertInfo(UID, server_info.peer_id)], dht)[0]
            with torch.no_grad():
                torch.testing.assert_close(expert(check), expected)
            for batch in batches:
                x = torch.randn(batch, hidden)

                def fwd(x: torch.Tensor = x) -> None:
                    with torch.no_grad():
                        expert(x)

                def fwdbwd(x: torch.Tensor = x) -> None:
                    xi = x.clone().requires_grad_(True)
                    expert(xi).sum().backward()

                for kind, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
                    sps = samples_per_s(fn, batch, seconds, min_reps)
                    result[f"hivemind_{kind}_b{batch}_sps"] = round(sps, 1)
            result["hivemind_fwd_b1_ms_median"] = _latency_ms(expert, hidden, latency_calls)
            # the lr=0 steps after every backward left the served weights as they were
            with torch.no_grad():
                torch.testing.assert_close(expert(check), expected)
        finally:
            if expert is not None:  # close the client's p2pd connection on its own event loop
                RemoteExpertWorker.run_coroutine(expert.p2p.shutdown())
            dht.shutdown()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (smoke test)")
    parser.add_argument("--seconds", type=float, default=1.5, help="time per measurement")
    parser.add_argument("--min-reps", type=int, default=3)
    parser.add_argument("--latency-calls", type=int, default=300)
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.min_reps, args.latency_calls = 0.2, 1, 20
    os.environ.setdefault("HIVEMIND_LOGLEVEL", "WARNING")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from core.experts.registry import ExpertSpec, build_expert  # no libp2p behind it

    spec = ExpertSpec("ffn", hidden=1024, inner=4096)
    result: dict[str, Any] = {"benchmark": "hivemind_compare", "hivemind": "1.1.12"}
    result.update(
        measure_hivemind(
            functools.partial(build_expert, spec, seed=7),
            spec.hidden,
            seconds=args.seconds,
            min_reps=args.min_reps,
            latency_calls=args.latency_calls,
        )
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
