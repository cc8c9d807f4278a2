"""What a project page shows, gathered from the swarm and checked: nothing on it is
taken on anyone's word but a key the project's signed manifest names.

- the project and its invite: the owner's signed manifest;
- the loss over time: the trainers' signed evaluations (core/protocol/evaluations.py),
  kept by the aggregators, each checked against the manifest's trainer keys;
- experts and who serves them: the servers' own signed DHT records (as ``owner status``);
- throughput, contributions, versions and the credit leaderboard: each aggregator's
  signed account (core/protocol/signed_report.py, as ``owner status``);
- bans and their reasons: the accusers' signed ban records, from the manifest's trainers
  and aggregators only.

The result is plain data (``page.json`` beside the page, core/page/render.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from core.control.invite import make_invite
from core.project.distribution import aggregator_peers, find_manifest
from core.project.leaderboard import leaderboard
from core.project.owner import status_of
from core.project.pins import PinStore
from core.protocol.bans import ban_key, decode_bans
from core.protocol.evaluations import EVALUATIONS, MAX_POINTS_PER_REPLY, EvaluationPoint
from core.protocol.fields import MessageError
from net import DhtError, Peer, RpcError
from net.identity import peer_id_from_public_key

log = logging.getLogger(__name__)

#: replies asked of one aggregator for evaluations (MAX_POINTS_PER_REPLY each)
_MAX_PAGES: Final = 16
#: the window the recent throughput is measured over (seconds of trainer time)
THROUGHPUT_WINDOW_S: Final = 600.0


async def collect_page(
    peer: Peer, project_id: str, data_dir: Path, bootstrap: Sequence[str]
) -> dict[str, Any]:
    """The page's data for ``project_id``, every figure checked (module docstring)."""
    signed = await find_manifest(peer, project_id, PinStore(data_dir / "pinned-owners.json"))
    status = await status_of(peer, signed)
    manifest = signed.manifest
    trainers = {bytes.fromhex(t.key) for t in manifest.trainers}
    points = await evaluations(peer, signed.project_id, manifest, trainers)
    accusers = {
        str(peer_id_from_public_key(bytes.fromhex(k)))
        for k in [a.key for a in manifest.aggregators] + [t.key for t in manifest.trainers]
    }
    pardoned = set(manifest.training.audit.pardoned)
    return {
        "generated": time.time(),
        "project": {
            "id": project_id,
            "name": manifest.project.name,
            "description": manifest.project.description,
            "owner": status["owner"],
            "serial": status["serial"],
            "invite": make_invite(project_id, list(bootstrap)).link(),
        },
        "status": status,
        "loss": loss_curves(points),
        "throughput": throughput(points),
        "leaderboard": leaderboard(status["aggregators"]),
        "bans": [b for b in await bans(peer, project_id, accusers) if b["peer"] not in pardoned],
    }


async def evaluations(
    peer: Peer, project: str, manifest: Any, trainers: set[bytes]
) -> list[EvaluationPoint]:
    """Every aggregator's kept evaluations, checked and without repeats (each trainer
    sends each point to every aggregator)."""
    seen: dict[tuple[bytes, float], EvaluationPoint] = {}
    for agg in aggregator_peers(peer, manifest):
        after = 0.0
        for _ in range(_MAX_PAGES):
            try:
                reply = await peer.rpc.call(agg, EVALUATIONS, {"after": after}, timeout=5)
            except RpcError as exc:
                log.info("no evaluations from aggregator %s: %s", agg, exc)
                break
            raw = reply.meta.get("points")
            if not isinstance(raw, list) or len(raw) > MAX_POINTS_PER_REPLY:
                log.info("aggregator %s answered no list of evaluations", agg)
                break
            for data in raw:
                try:
                    point = EvaluationPoint.decode(data)
                except MessageError as exc:
                    log.info("an evaluation from %s skipped: %s", agg, exc)
                    continue
                if point.project == project and point.trainer in trainers and point.verify():
                    seen[(point.trainer, point.time)] = point
                    after = max(after, point.time)
            if not reply.meta.get("more") or not raw:
                break
    return sorted(seen.values(), key=lambda p: (p.time, p.trainer))


def loss_curves(points: Sequence[EvaluationPoint]) -> list[dict[str, Any]]:
    """One curve per trainer, oldest first: ``{trainer, points: [[time, step, samples,
    tokens, loss], ...]}``. Pure."""
    curves: dict[str, list[list[float]]] = {}
    for p in sorted(points, key=lambda p: p.time):
        who = str(peer_id_from_public_key(p.trainer))
        curves.setdefault(who, []).append([p.time, p.step, p.samples, p.tokens, p.loss])
    return [{"trainer": who, "points": pts} for who, pts in sorted(curves.items())]


def throughput(
    points: Sequence[EvaluationPoint], window_s: float = THROUGHPUT_WINDOW_S
) -> dict[str, float]:
    """Samples and tokens per second over each trainer's evaluations of the last
    ``window_s`` seconds (from its last point before them when fewer than two fall
    inside), summed over trainers; a trainer with fewer than two points, or whose count
    went back (a restart from an older checkpoint), adds nothing. Pure."""
    samples_per_s = tokens_per_s = 0.0
    by_trainer: dict[bytes, list[EvaluationPoint]] = {}
    for p in sorted(points, key=lambda p: p.time):
        by_trainer.setdefault(p.trainer, []).append(p)
    for pts in by_trainer.values():
        if len(pts) < 2:
            continue
        last = pts[-1]
        inside = [p for p in pts if p.time >= last.time - window_s]
        first = inside[0] if len(inside) >= 2 else pts[-2]
        seconds = last.time - first.time
        if seconds > 0 and last.samples >= first.samples:
            samples_per_s += (last.samples - first.samples) / seconds
            tokens_per_s += (last.tokens - first.tokens) / seconds
    return {"samples_per_s": samples_per_s, "tokens_per_s": tokens_per_s}


async def bans(peer: Peer, project: str, accusers: set[str]) -> list[dict[str, Any]]:
    """The bans in force, from the accusers' own records: ``{peer, reason, until, by}``,
    the latest ending first."""
    try:
        records = await peer.dht.announcers(ban_key(project))
    except DhtError as exc:
        log.info("could not read the project's bans: %s", exc)
        return []
    now = time.time()
    out = []
    for author, record in records.items():
        if str(author) not in accusers:
            continue
        try:
            for_project, found = decode_bans(record.value)
        except MessageError:
            continue
        if for_project != project:
            continue
        out += [
            {"peer": b.peer, "reason": b.reason, "until": b.until, "by": str(author)}
            for b in found
            if b.until > now
        ]
    return sorted(out, key=lambda b: -b["until"])
