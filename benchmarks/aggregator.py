"""The aggregator's costs for an expert of ~4 million parameters, 16 contributors a round.

    python benchmarks/aggregator.py [--quick]

Prints one JSON line: contributions verified per second and MB/s (signature, receipts,
digest of the payload, decoding, finiteness), the time of one robust round (centered
clipping with momentum and bucketing) beside a plain-mean round in the same run, and the
bytes on the wire per contribution for each codec beside fp32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.aggregator.core import AggregatorCore, AggregatorSettings
from core.aggregator.robust import ExpertRoundState, RobustSettings, robust_round
from core.aggregator.verify import VerifyContext, verify
from core.contributing.codecs import CODECS, codec
from core.experts.registry import ExpertSpec, build_expert
from core.protocol.contributions import Contribution, ParamSpec, Receipt
from net import Identity

SPEC = ExpertSpec("ffn", hidden=1024, inner=1920)  # 3.94 M parameters
CONTRIBUTORS = 16
UID = "ffn0.0.0"


def _contributions(
    codec_name: str, trainer: Identity
) -> tuple[list[tuple[Contribution, list[torch.Tensor]]], dict[str, int]]:
    module = build_expert(SPEC, seed=0)
    params = {n: p.numel() for n, p in module.named_parameters()}
    c = codec(codec_name)
    out = []
    for i in range(CONTRIBUTORS):
        g = torch.Generator().manual_seed(i)
        parts = [
            part for n, k in params.items() for part in c.encode(torch.randn(k, generator=g) * 1e-3)
        ]
        receipts = [Receipt.sign(trainer, "bench", UID, 0, [], [], 64) for _ in range(8)]
        msg = Contribution.create(
            Identity.generate(),
            project="bench",
            uid=UID,
            base_version=0,
            codec=codec_name,
            params=[ParamSpec(n, k) for n, k in params.items()],
            receipts=receipts,
            parts=parts,
        )
        out.append((msg, parts))
    return out, params


def _wire_bytes(msg: Contribution, parts: list[torch.Tensor]) -> int:
    return len(msg.encode()) + sum(p.numel() * p.element_size() for p in parts)


def run(args: argparse.Namespace) -> dict[str, Any]:
    trainer = Identity.generate()
    result: dict[str, Any] = {"benchmark": "aggregator"}
    contributions, params = _contributions("fp16", trainer)
    result["params"] = sum(params.values())
    result["contributors"] = CONTRIBUTORS

    # verification throughput (fp16 payloads, as volunteers send by default)
    ctx = VerifyContext(
        project="bench",
        params={UID: params},
        current_version={UID: 0},
        staleness_bound=4,
        trainers={trainer.public_key},
        seen_nonces=set(),
        seen_batches=set(),
        now=time.time(),
    )
    wire = sum(_wire_bytes(m, p) for m, p in contributions)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for msg, parts in contributions:
            verify(msg, parts, ctx)
        times.append(time.perf_counter() - t0)
    best = statistics.median(times)
    result["verify_per_s"] = round(CONTRIBUTORS / best, 1)
    result["verify_mb_s"] = round(wire / best / 1e6, 1)

    # one round: centered clipping (momentum, buckets) beside the plain mean
    means = {f"c{i}": torch.randn(result["params"]) * 1e-3 for i in range(CONTRIBUTORS)}
    for rule in ("centered_clip", "mean"):
        state = ExpertRoundState()
        robust_round(state, means, RobustSettings(rule=rule))  # first round sets the history
        t = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            robust_round(state, means, RobustSettings(rule=rule))
            t.append(time.perf_counter() - t0)
        result[f"round_s_{rule}"] = round(statistics.median(t), 4)

    # the whole engine: accept 16 contributions (fsynced journal) and run a round
    with tempfile.TemporaryDirectory() as folder:
        settings = AggregatorSettings(
            project="bench", spec=SPEC, uids=(UID,), trainers=frozenset({trainer.public_key})
        )
        core = AggregatorCore(settings, Path(folder))
        t0 = time.perf_counter()
        for msg, parts in contributions:
            core.submit(msg, parts)
        result["accept_journaled_per_s"] = round(CONTRIBUTORS / (time.perf_counter() - t0), 1)
        t0 = time.perf_counter()
        core.run_round(UID)
        result["engine_round_with_checkpoint_s"] = round(time.perf_counter() - t0, 3)
        core.close()

    for name in CODECS:
        msgs, _ = _contributions(name, trainer) if name != "fp16" else (contributions, params)
        result[f"bytes_{name.replace('int8_block', '8bit')}"] = _wire_bytes(*msgs[0])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
