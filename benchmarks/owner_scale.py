"""The owner's side at real sizes: an aggregator's memory and what its rounds write, two
aggregator processes sharing a project with one killed (SIGKILL) and restarted, and a
trainer's routing at grid 64x64.

    python benchmarks/owner_scale.py [--experts 64] [--hidden 1024] [--inner 4096]
                                     [--contributors 4] [--rounds 2] [--quick]

Prints one JSON line:

- ``aggregator_bytes_per_param``: the resident memory (VmRSS, the interpreter and torch
  included) of an aggregator process after ``--rounds`` rounds of each of ``--experts``
  ffn experts (bfloat16 project, Adam, ``--contributors`` contributors each, contribution
  audits on), over the parameters it holds; ``aggregator_peak_bytes_per_param`` its
  VmHWM. The process runs AggregatorCore as the network service does (contributions
  arrive as bytes on a pipe, each acknowledged once in the journal). Beside it,
  ``aggregator_bytes_per_param_before``: what the layout before (float32 master, Adam
  state and center, a float32 momentum per contributor, the last staleness_bound + 1
  versions in memory) holds for the same project, computed from that state;
- ``checkpoint_bytes_per_round_ratio``: bytes a round writes (the expert's file, its
  kept version, the state file, the round's record) over the bytes of the state of the
  expert it changed (its file), mean over the rounds; ``..._before``: the single
  checkpoint of everything the layout before wrote after every round, over the same;
  ``journal_bytes_per_round_ratio``: the contributions' own journal records per round
  (written as they are accepted, before any round), over the same;
- ``acknowledged_lost``: contributions two real aggregator processes (``moehome
  aggregator run``) acknowledged and no longer know after one of them was killed with
  SIGKILL mid-run and restarted (each acknowledged one is sent again at the end: an
  aggregator that still has it, pending or applied, refuses it as a replay);
  ``rounds_after_restart``: the killed one's rounds after its restart; ``held_resent``:
  contributions a volunteer held while their aggregator was down and sent again;
- the routing figures of benchmarks/routing_scale.py (grid 64x64, k=4, 8,192 tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import torch
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.aggregator.core import AggregatorCore, AggregatorSettings
from core.aggregator.journal import tensor_from_record, tensor_record
from core.aggregator.verify import Rejected
from core.contributing.codecs import codec
from core.experts.registry import ExpertSpec, build_expert
from core.experts.wire import to_wire
from core.project.assignment import expert_assignment
from core.protocol.aggregator_methods import CONTRIBUTE, STATS, responsible_aggregator
from core.protocol.contributions import Contribution, ParamSpec, Receipt
from core.protocol.signed_report import SignedReport
from net import Identity
from net.codec import pack, unpack_bounded

ROOT = Path(__file__).resolve().parent.parent
FRAME = struct.Struct(">I")
TRAINER = Identity.from_seed(b"owner-scale-trainer".ljust(32, b"."))
PROJECT = "owner-scale"
SAMPLES = 8  # per contribution: two receipts of 4


# ---------------------------------------------------------------- 1. one aggregator's memory


def _rss() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


def _settings(experts: int, spec: ExpertSpec, contributors: int) -> AggregatorSettings:
    return AggregatorSettings(
        project=PROJECT,
        spec=spec,
        uids=tuple(f"ffn0.{i}" for i in range(experts)),
        trainers=frozenset({TRAINER.public_key}),
        optimizer="adam",
        learning_rate=1e-3,
        staleness_bound=4,
        round_samples=contributors * SAMPLES,
        round_seconds=1e9,
        min_contributors=contributors,
        contribution_audit_rate=0.05,
    )


def worker(folder: Path, experts: int, hidden: int, inner: int, contributors: int) -> None:
    """The aggregator process: contributions as frames on stdin, a JSON line per
    acknowledgement on stdout, rounds as they fall due, its figures at the end."""
    spec = ExpertSpec("ffn", hidden, inner, dtype="bfloat16")
    core = AggregatorCore(_settings(experts, spec, contributors), folder)
    params = sum(p.numel() for m in core.modules.values() for p in m.parameters())
    stdin, stdout = sys.stdin.buffer, sys.stdout
    rounds: list[dict[str, int]] = []
    while True:
        head = stdin.read(FRAME.size)
        if len(head) < FRAME.size:
            break
        (length,) = FRAME.unpack(head)
        record = unpack_bounded(stdin.read(length), 1 << 31)
        c = Contribution.decode(record[0])
        try:
            core.submit(c, [tensor_from_record(r) for r in record[1]])
        except Rejected as exc:
            stdout.write(json.dumps({"refused": exc.reason}) + "\n")
            stdout.flush()
            continue
        stdout.write(json.dumps({"accepted": True}) + "\n")
        stdout.flush()
        if core.due(c.uid):
            before = core.round_bytes_written
            core.run_round(c.uid)
            expert_file = folder / "experts" / f"{c.uid}.safetensors"
            rounds.append(
                {"written": core.round_bytes_written - before, "state": expert_file.stat().st_size}
            )
    memory = _rss()
    stdout.write(
        json.dumps(
            {
                "params": params,
                "rss": memory["VmRSS"],
                "peak": memory["VmHWM"],
                "rounds": rounds,
                "journal_bytes": core._journal.bytes_written,
                "versions": sum(core.versions.values()),
            }
        )
        + "\n"
    )
    core.close()


def contribution(
    who: Identity,
    uid: str,
    version: int,
    params: dict[str, int],
    generator: torch.Generator,
    *,
    project: str = PROJECT,
    scale: float = 1e-3,
) -> tuple[Contribution, list[torch.Tensor]]:
    """``who``'s random gradient of ``scale`` for ``uid`` at ``version``, in fp16 as
    volunteers send, behind two receipts of TRAINER for 4 samples each."""
    fp16 = codec("fp16")
    parts = [
        part
        for k in params.values()
        for part in fp16.encode(torch.randn(k, generator=generator) * scale)
    ]
    receipts = [Receipt.sign(TRAINER, project, uid, version, [], [], 4) for _ in range(2)]
    msg = Contribution.create(
        who,
        project=project,
        uid=uid,
        base_version=version,
        codec="fp16",
        params=[ParamSpec(n, k) for n, k in params.items()],
        receipts=receipts,
        parts=parts,
    )
    return msg, parts


def _send(pipe: IO[bytes], msg: Contribution, parts: list[torch.Tensor]) -> None:
    data = pack([msg.encode(), [tensor_record(p) for p in parts]])
    pipe.write(FRAME.pack(len(data)) + data)
    pipe.flush()


def aggregator_memory(
    experts: int, hidden: int, inner: int, contributors: int, rounds: int, folder: Path
) -> dict[str, Any]:
    spec = ExpertSpec("ffn", hidden, inner, dtype="bfloat16")
    params = {n: p.numel() for n, p in build_expert(spec).named_parameters()}
    per_expert = sum(params.values())
    cmd = [sys.executable, __file__, "--worker", str(folder), "--experts", str(experts)]
    cmd += ["--hidden", str(hidden), "--inner", str(inner), "--contributors", str(contributors)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None
    assert proc.stdout is not None
    volunteers = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(contributors)]
    generator = torch.Generator().manual_seed(0)
    acknowledged = 0
    t0 = time.monotonic()
    for version in range(rounds):
        for e in range(experts):
            for who in volunteers:
                _send(proc.stdin, *contribution(who, f"ffn0.{e}", version, params, generator))
                reply = json.loads(proc.stdout.readline())
                acknowledged += bool(reply.get("accepted"))
    proc.stdin.close()
    result = json.loads(proc.stdout.readline())
    proc.wait()
    held = result["params"]
    done = result["rounds"]
    ratio = sum(r["written"] / r["state"] for r in done) / len(done)
    journal_per_round = result["journal_bytes"] / len(done)
    state_bytes = sum(r["state"] for r in done) / len(done)
    # the layout before, for the same project: float32 master and Adam's two moments,
    # the center, a float32 momentum per contributor, staleness_bound + 1 = 5 versions
    # in the project's dtype (2 bytes), all in memory; its checkpoint wrote all of it
    # but the versions after every round
    before_state = 4 + 8 + 4 + 4 * contributors
    before = before_state + 5 * 2
    return {
        "experts": experts,
        "expert_params": per_expert,
        "contributors": contributors,
        "rounds_per_expert": rounds,
        "contributions": acknowledged,
        "aggregator_bytes_per_param": round(result["rss"] / held, 2),
        "aggregator_peak_bytes_per_param": round(result["peak"] / held, 2),
        "aggregator_bytes_per_param_before": before,
        "checkpoint_bytes_per_round_ratio": round(ratio, 3),
        # everything, after each round, over the one expert it changed
        "checkpoint_bytes_per_round_ratio_before": float(experts),
        "journal_bytes_per_round_ratio": round(journal_per_round / state_bytes, 3),
        "aggregator_seconds": round(time.monotonic() - t0, 1),
    }


# ---------------------------------------------------------------- 2. two aggregators, one killed


async def _start_aggregator(data_dir: Path, pid: str, bootstrap: str) -> tuple[Any, str]:
    cmd = [sys.executable, "-m", "core.cli", "--quiet", "--data-dir", str(data_dir)]
    cmd += ["aggregator", "run", "--project", pid, "-b", bootstrap]
    proc = await trio.to_thread.run_sync(
        lambda: subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    )
    assert proc.stdout is not None
    line = (await trio.to_thread.run_sync(proc.stdout.readline)).strip()
    if not line.startswith("/ip4/"):
        raise RuntimeError(f"the aggregator did not start: {line!r}")
    return proc, line


async def two_aggregators(folder: Path) -> dict[str, Any]:
    from core.namespaces import moehome_validator
    from core.paths import identity_path
    from core.project.keys import OwnerKey
    from core.project.publish import prepare, serve_project
    from core.project.template import write_template
    from net import Peer, RemoteError, parse_peer_addr
    from net.identity import load_or_create

    dirs = [folder / f"aggregator{i}" for i in range(2)]
    keys = [load_or_create(identity_path(d, "aggregator")).public_key for d in dirs]
    manifest = folder / "project.toml"
    write_template(manifest, "scale")
    text = manifest.read_text()
    for old, new in {
        "grid = [2, 4]": "grid = [8]",
        "mixture_layers = 2": "mixture_layers = 1",
        "hidden = 64": "hidden = 16",
        "inner = 128": "inner = 32",
        "round_samples = 4096": "round_samples = 24",
        "contribution_rate = 0.05": "contribution_rate = 0.0",
    }.items():
        text = text.replace(old, new)
    text = text.replace("min_contributors = 2 ", "min_contributors = 1 ")
    text += "".join(f'\n[[aggregators]]\nkey = "{k.hex()}"\n' for k in keys)
    text += f'\n[[trainers]]\nkey = "{TRAINER.public_key.hex()}"\n'
    manifest.write_text(text)
    prepared = prepare(manifest, OwnerKey.generate(), (), folder / "owner")
    signed = prepared.signed
    pid = signed.project_id
    spec = signed.manifest.model.expert_spec()
    uids = list(signed.manifest.model.expert_uids())
    params = {n: p.numel() for n, p in build_expert(spec).named_parameters()}
    assignment = expert_assignment(signed.manifest)
    generator = torch.Generator().manual_seed(1)
    volunteers = [Identity.generate() for _ in range(3)]
    peers_of: dict[bytes, Any] = {}
    versions = dict.fromkeys(uids, 0)
    acked: list[tuple[int, Contribution, list[Any]]] = []  # (aggregator, message, wires)
    held: list[tuple[Contribution, list[Any]]] = []
    result: dict[str, Any] = {}
    procs: list[Any] = []

    def make(who: Identity, uid: str) -> tuple[Contribution, list[Any]]:
        msg, parts = contribution(
            who, uid, versions[uid], params, generator, project=pid, scale=1.0
        )
        return msg, [to_wire(p) for p in parts]

    try:
        async with trio.open_nursery() as nursery:
            owner: Peer = await nursery.start(
                Peer(Identity.generate(), validator=moehome_validator()).run
            )
            await nursery.start(serve_project, owner, prepared)
            for who in volunteers:  # a contribution is sent by the volunteer that signed it
                peers_of[who.public_key] = await nursery.start(
                    Peer(who, validator=moehome_validator()).run
                )
            sender: Peer = peers_of[volunteers[0].public_key]
            addrs = []
            for d in dirs:
                proc, addr = await _start_aggregator(d, pid, owner.addrs()[0])
                procs.append(proc)
                addrs.append(addr)
                for volunteer in peers_of.values():
                    await volunteer.host.connect_addr(addr)
            peers = [parse_peer_addr(a).peer_id for a in addrs]
            down: set[int] = set()

            async def send(who: Identity, uid: str) -> None:
                msg, wires = make(who, uid)
                target = peers.index(responsible_aggregator(uid, peers, assignment))
                if target in down:  # the volunteer holds it and sends it again later
                    held.append((msg, wires))
                    return
                reply = await peers_of[who.public_key].rpc.call(
                    peers[target], CONTRIBUTE, {"header": msg.encode()}, wires
                )
                if reply.meta.get("accepted") is True:
                    acked.append((target, msg, wires))

            async def stats(i: int) -> dict[str, Any]:
                signed = SignedReport.decode(
                    (await sender.rpc.call(peers[i], STATS)).meta["signed"]
                )
                return signed.report().model_dump()

            async def settle() -> None:
                for i in range(2):
                    if i in down:
                        continue
                    v = await stats(i)
                    for uid, version in v["versions"].items():
                        versions[uid] = max(versions[uid], int(version))

            for _ in range(2):  # two rounds of every expert, then one more begun
                for uid in uids:
                    for who in volunteers:
                        await send(who, uid)
                await trio.sleep(1.0)
                await settle()
            for uid in uids:
                await send(volunteers[0], uid)  # mid-round: pending at both
            killed = 0
            before_kill = {u: versions[u] for u in uids if assignment[u] == killed}
            procs[killed].send_signal(signal.SIGKILL)
            procs[killed].wait()
            down.add(killed)
            for uid in uids:
                for who in volunteers[1:]:
                    await send(who, uid)
            await trio.sleep(1.0)
            await settle()
            proc, addr = await _start_aggregator(dirs[killed], pid, owner.addrs()[0])
            procs[killed] = proc
            for volunteer in peers_of.values():
                await volunteer.host.connect_addr(addr)
            down.clear()
            for msg, wires in held:
                reply = await peers_of[msg.contributor].rpc.call(
                    peers[killed], CONTRIBUTE, {"header": msg.encode()}, wires
                )
                if reply.meta.get("accepted") is True:
                    acked.append((killed, msg, wires))
            held_resent = len(held)
            await settle()
            for uid in uids:
                for who in volunteers:
                    await send(who, uid)
            with trio.fail_after(60):
                while True:
                    await settle()
                    after = {u: versions[u] for u in before_kill}
                    if sum(after.values()) > sum(before_kill.values()):
                        break
                    await trio.sleep(0.5)
            lost = 0
            for target, msg, wires in acked:
                try:
                    await peers_of[msg.contributor].rpc.call(
                        peers[target], CONTRIBUTE, {"header": msg.encode()}, wires
                    )
                    lost += 1  # accepted again: the aggregator had lost it
                except RemoteError as exc:
                    if exc.code != "replay":
                        lost += 1
            result = {
                "aggregators": 2,
                "experts_per_aggregator": [
                    sum(1 for u in uids if assignment[u] == i) for i in range(2)
                ],
                "acknowledged": len(acked),
                "acknowledged_lost": lost,
                "held_resent": held_resent,
                "rounds_after_restart": sum(after.values()) - sum(before_kill.values()),
            }
            nursery.cancel_scope.cancel()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--inner", type=int, default=4096)
    parser.add_argument("--contributors", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="8 experts of 256/1024")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--skip", nargs="*", default=[], choices=["memory", "kill", "routing"])
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.experts, args.hidden, args.inner, args.contributors)
        return
    if args.quick:
        args.experts, args.hidden, args.inner = 8, 256, 1024
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="owner-scale-") as tmp:
        if "memory" not in args.skip:
            out.update(
                aggregator_memory(
                    args.experts,
                    args.hidden,
                    args.inner,
                    args.contributors,
                    args.rounds,
                    Path(tmp) / "memory",
                )
            )
        if "kill" not in args.skip:
            out.update(trio.run(two_aggregators, Path(tmp) / "kill"))
    if "routing" not in args.skip:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from routing_scale import measure

        out.update(measure(8192, (64, 64), 4, 64, 10))
    print(json.dumps(out))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    main()
