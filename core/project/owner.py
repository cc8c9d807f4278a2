"""The owner's local state (key and rotation chain) and the owner CLI's work."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from pydantic import ValidationError

from core.experts.records import SERVING, ExpertAnnouncement, expert_key
from core.files import replace_file
from core.paths import config_dir
from core.project.distribution import aggregator_peers, find_manifest
from core.project.keys import KeyRotation, OwnerKey, OwnerKeyError, fingerprint
from core.project.pins import PinStore
from core.project.records import ProviderAnnouncement, providers_key, rotation_key
from core.project.signed import SignedManifest
from core.protocol.aggregator_methods import STATS, AggregatorReport
from core.protocol.fields import MessageError
from core.protocol.signed_report import SignedReport
from net import Peer, RpcError
from net.codec import pack, unpack_bounded

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OwnerFiles:
    root: Path

    @classmethod
    def default(cls) -> OwnerFiles:
        return cls(config_dir() / "owner")

    @property
    def key(self) -> Path:
        return self.root / "owner.key"

    @property
    def rotations(self) -> Path:
        return self.root / "rotations.msgpack"

    def load_rotations(self) -> tuple[KeyRotation, ...]:
        if not self.rotations.exists():
            return ()
        try:
            items = unpack_bounded(self.rotations.read_bytes(), 64 * 1024)
            return tuple(KeyRotation.from_obj(r) for r in items)
        except Exception as exc:  # a damaged file must not be silently ignored
            raise OwnerKeyError(f"{self.rotations} is damaged: {exc}") from exc

    def save_rotations(self, rotations: Sequence[KeyRotation]) -> None:
        replace_file(self.rotations, pack([r.to_obj() for r in rotations]))


def init_owner(files: OwnerFiles, passphrase: str | None, *, force: bool = False) -> OwnerKey:
    if files.key.exists() and not force:
        raise OwnerKeyError(
            f"an owner key exists at {files.key}; use --force to replace it "
            "(projects signed with it stay tied to it)"
        )
    key = OwnerKey.generate()
    key.save(files.key, passphrase)
    return key


def rotate_owner(
    files: OwnerFiles, passphrase: str | None, new_passphrase: str | None
) -> KeyRotation:
    """A new owner key, handed over by a rotation signed with the old one. The old key is
    kept beside it (renamed) in case the owner needs to prove something with it."""
    old = OwnerKey.load(files.key, passphrase)
    new = OwnerKey.generate()
    rotation = KeyRotation.create(old, new.public_key)
    chain = [*files.load_rotations(), rotation]
    files.key.rename(files.root / f"owner-{old.fingerprint}.key.old")
    new.save(files.key, new_passphrase)
    files.save_rotations(chain)
    return rotation


async def announce_rotation(peer: Peer, rotation: KeyRotation) -> int:
    return await peer.dht.put(rotation_key(rotation.old), rotation.encode(), ttl=30 * 24 * 3600)


async def project_status(peer: Peer, project_id: str, data_dir: Path) -> dict[str, Any]:
    """What the swarm says about a project, for ``moehome owner status``."""
    signed = await find_manifest(peer, project_id, PinStore(data_dir / "pinned-owners.json"))
    return await status_of(peer, signed)


#: experts looked up at once. All of the demo's 16 at once are ~80 DHT queries in flight
#: from a process that has just joined; on a busy CI computer, beside the sampling of the
#: model, the demo's page once said 7 of 16 experts were covered while its volunteers
#: served all of them (the announcer declares a few at a time after such timeouts)
LOOKUPS_AT_ONCE = 4


async def status_of(peer: Peer, signed: SignedManifest) -> dict[str, Any]:
    """``project_status`` of a manifest found already: every figure from a signed record
    (the servers' and providers' own) or account (the aggregators', signed by the keys
    the manifest lists)."""
    project_id = signed.project_id
    manifest = signed.manifest
    uids = list(manifest.model.expert_uids())
    experts: dict[str, list[dict[str, Any]]] = {}
    withdrawn: set[str] = set()  # declared lately, withdrawn now: paused (or leaving)
    answered: set[str] = set()  # a record found, if only a withdrawal
    limiter = trio.CapacityLimiter(LOOKUPS_AT_ONCE)

    async def servers_of(uid: str) -> None:
        found = []
        async with limiter:
            records = await peer.dht.announcers(expert_key(project_id, uid))
        if records:
            answered.add(uid)
        for author, record in records.items():
            try:
                ann = ExpertAnnouncement.decode(record.value)
            except Exception as exc:  # noqa: BLE001 - checked on the way in; skip odd ones
                log.debug("skipping an expert record: %s", exc)
                continue
            if ann.state == SERVING:
                found.append({"peer": str(author), "version": ann.version, "load": ann.load})
            else:
                withdrawn.add(str(author))
        experts[uid] = found

    async with trio.open_nursery() as nursery:
        for uid in uids:
            nursery.start_soon(servers_of, uid)
    # an expert nobody declared is what the owner acts on: look once more before saying
    # so (one lookup whose queries timed out on a busy computer is not an answer)
    async with trio.open_nursery() as nursery:
        for uid in [u for u in uids if u not in answered]:
            nursery.start_soon(servers_of, uid)
    providers = []
    for author, record in (await peer.dht.announcers(providers_key(project_id))).items():
        try:
            ann = ProviderAnnouncement.decode(record.value)
        except Exception as exc:  # noqa: BLE001 - checked on the way in; skip odd ones
            log.debug("skipping a provider record: %s", exc)
            continue
        providers.append({"peer": str(author), "index": ann.index, "uids": list(ann.uids) or "all"})
    volunteers = sorted({s["peer"] for servers in experts.values() for s in servers})
    aggregators = await aggregator_statistics(peer, signed)
    return {
        "project_id": project_id,
        "name": manifest.project.name,
        "owner": fingerprint(signed.owner_key),
        "serial": signed.serial,
        "experts_total": len(uids),
        "experts_covered": sum(1 for u in uids if experts[u]),
        "uncovered": [u for u in uids if not experts[u]],
        "experts": {u: experts[u] for u in uids},
        "volunteers": volunteers,
        "paused_volunteers": sorted(withdrawn - set(volunteers)),
        "weight_providers": providers,
        "aggregators": [a.to_obj() for a in aggregators],
        # why the experts' versions do not move ("" when nothing holds them back)
        "experts_waiting": why_experts_wait(aggregators, manifest.training.min_contributors),
    }


@dataclass(frozen=True)
class AggregatorAccount:
    """An aggregator of the manifest and its own account (agg.stats), or why it gave
    none."""

    key: str
    peer: str
    report: AggregatorReport | None = None
    #: why it could not be asked, or its answer read ("" when it answered)
    unreachable: str = ""

    def to_obj(self) -> dict[str, Any]:
        """As ``owner status --json`` and the trainer's summary show it."""
        out: dict[str, Any] = {"key": self.key, "peer": self.peer}
        if self.report is None:
            return out | {"unreachable": self.unreachable}
        return out | self.report.model_dump()


async def aggregator_statistics(peer: Peer, signed: SignedManifest) -> list[AggregatorAccount]:
    """Each aggregator's own account (versions, accepted, rejections by reason), signed
    by the key the manifest lists for it; or why it could not be had."""
    out: list[AggregatorAccount] = []
    manifest = signed.manifest
    for entry, agg in zip(manifest.aggregators, aggregator_peers(peer, manifest), strict=True):
        try:
            reply = await peer.rpc.call(agg, STATS, timeout=5)
            report = verified_report(reply.meta, bytes.fromhex(entry.key), signed.project_id)
        except RpcError as exc:
            out.append(AggregatorAccount(entry.key, str(agg), unreachable=str(exc)))
        except ValidationError as exc:
            why = f"answered with no account: {exc.error_count()} field(s) of the wrong type"
            out.append(AggregatorAccount(entry.key, str(agg), unreachable=why))
        except MessageError as exc:
            out.append(AggregatorAccount(entry.key, str(agg), unreachable=f"answered {exc}"))
        else:
            out.append(AggregatorAccount(entry.key, str(agg), report))
    return out


def verified_report(meta: Mapping[str, Any], key: bytes, project: str) -> AggregatorReport:
    """The account in an agg.stats reply, once its signature is checked against ``key``
    (the manifest's) and its project is ``project``; MessageError says what is wrong, a
    ValidationError which fields do not fit."""
    signed = SignedReport.decode(meta.get("signed"))
    if signed.aggregator != key or not signed.verify():
        raise MessageError("with an account its key did not sign")
    if signed.project != project:
        raise MessageError(f"with an account of another project ({signed.project})")
    return signed.report()


def why_experts_wait(aggregators: Sequence[AggregatorAccount], min_contributors: int) -> str:
    """Why the experts' versions do not move, in a sentence, from the aggregators' own
    accounts (``aggregator_statistics``); "" when nothing holds them back. Pure."""
    reasons = []
    for agg in aggregators:
        who = f"aggregator {agg.peer[-8:]}"
        if agg.report is None:
            reasons.append(f"{who} cannot be reached ({agg.unreachable})")
            continue
        short = agg.report.short_of_contributors
        if short:
            uid, more = next(iter(sorted(short.items())))
            reasons.append(
                f"{who}: {len(short)} expert(s) wait for more volunteers (a version needs "
                f"{min_contributors} distinct contributors, the manifest's min_contributors; "
                f"{uid} needs {more} more)"
            )
    return "; ".join(reasons)


def to_json(status: dict[str, Any]) -> str:
    return json.dumps(status, indent=2, sort_keys=False)
