"""The aggregator on the network: takes contributions over the RPC, runs rounds when they
are due, and says in the DHT which version of each expert is current."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any, Final

import torch
import trio

from core.aggregator.core import AggregatorCore
from core.aggregator.verify import Rejected
from core.contrib.messages import Contribution, MessageError
from core.contrib.sender import CONTRIBUTE
from core.experts.weights import save_weights
from core.experts.wire import from_wire
from core.project.chunks import ChunkStore, FileEntry, split_file
from net import (
    BadRequest,
    CallContext,
    DhtError,
    NamespaceRule,
    Peer,
    RecordRejected,
    RemoteError,
    Reply,
    SignedRecord,
)
from net.identity import peer_id_from_public_key
from net.wire import pack, unpack_bounded

log = logging.getLogger(__name__)

STATS: Final = "agg.stats"
MAX_CONTRIBUTORS_LISTED: Final = 256


def version_key(project: str, uid: str) -> str:
    return f"/moehome/{VERSION_NAMESPACE}/{project}/{uid}"


def _check_version(record: SignedRecord) -> None:
    try:
        obj = unpack_bounded(record.value, 8192)
    except Exception as exc:  # garbage from a peer
        raise RecordRejected("schema", f"version record is not msgpack ({exc})") from exc
    if not (
        isinstance(obj, dict)
        and isinstance(obj.get("uid"), str)
        and isinstance(obj.get("version"), int)
        and isinstance(obj.get("sha256"), str)
        and len(obj["sha256"]) == 64
        and record.key.endswith("/" + obj["uid"])
    ):
        raise RecordRejected("schema", "version record needs uid, version and sha256")


VERSION_NAMESPACE: Final = "version"
VERSION_RULE: Final = NamespaceRule(
    max_ttl_s=3600.0, max_value_bytes=8192, check=_check_version, store_share=1 / 4
)


class Refused(RemoteError):
    """A contribution was refused; the error code is the reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.code = reason  # type: ignore[misc]  # one code per reason, not per class


class AggregatorService:
    def __init__(
        self,
        peer: Peer,
        core: AggregatorCore,
        *,
        store: ChunkStore | None = None,
        version_ttl: float = 600.0,
    ) -> None:
        self.peer = peer
        self.core = core
        self.store = store  # where new versions' chunks go, served by a WeightsService
        self.version_ttl = version_ttl
        self._engine = trio.CapacityLimiter(1)  # the core is used by one thread at a time
        peer.rpc.register(CONTRIBUTE, self._contribute)
        peer.rpc.register(STATS, self._stats)

    async def run(
        self, *, task_status: trio.TaskStatus[AggregatorService] = trio.TASK_STATUS_IGNORED
    ) -> None:
        for uid in self.core.settings.uids:
            await self._announce_version(uid)
        task_status.started(self)
        while True:
            for uid in self.core.settings.uids:
                if self.core.due(uid):
                    await trio.to_thread.run_sync(self.core.run_round, uid, limiter=self._engine)
                    await self._announce_version(uid)
            await trio.sleep(0.2)

    async def _announce_version(self, uid: str) -> None:
        """Say which version of ``uid`` is current, and where its weights are: the file's
        chunks are in our store, served by our WeightsService."""
        record: dict[str, Any] = {
            "uid": uid,
            "version": self.core.versions[uid],
            "sha256": self.core.weights_sha256(uid),
        }
        if self.store is not None:
            entry = await trio.to_thread.run_sync(self._export, uid, limiter=self._engine)
            record["file"] = [entry.sha256, entry.size, list(entry.chunks)]
        try:
            await self.peer.dht.put(
                version_key(self.core.settings.project, uid), pack(record), self.version_ttl
            )
        except DhtError as exc:
            log.info("could not announce the version of %s: %s", uid, exc)

    def _export(self, uid: str) -> FileEntry:
        assert self.store is not None
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{uid}.safetensors"
            save_weights(self.core.modules[uid], path, version=self.core.versions[uid])
            return split_file(path.read_bytes(), self.store)

    async def _contribute(self, ctx: CallContext) -> Reply:
        raw = ctx.request.meta.get("header")
        if not isinstance(raw, bytes):
            raise BadRequest("a contribution needs its header")
        try:
            contribution = Contribution.decode(raw)
        except MessageError as exc:
            raise Refused("malformed", str(exc)) from exc
        if ctx.peer_id != peer_id_from_public_key(contribution.contributor):
            raise Refused("not_yours", "contributions are sent by the volunteer that signed them")
        parts: list[torch.Tensor] = [from_wire(t) for t in ctx.request.tensors]
        try:
            await trio.to_thread.run_sync(
                self.core.submit, contribution, parts, limiter=self._engine
            )
        except Rejected as exc:
            raise Refused(exc.reason, str(exc)) from exc
        return Reply({"accepted": True, "version": self.core.versions[contribution.uid]})

    async def _stats(self, ctx: CallContext) -> Reply:
        return Reply(self.statistics())

    def statistics(self) -> dict[str, Any]:
        s = self.core.stats
        return {
            "accepted": s.accepted,
            "rejected": dict(s.rejected),
            "rounds": s.rounds,
            "banned_peers": s.banned_peers,
            "versions": dict(self.core.versions),
            # the most active contributors (a reply stays small in a big swarm)
            "contributors": {
                who: c.to_obj()
                for who, c in sorted(s.contributors.items(), key=lambda item: -item[1].accepted)[
                    :MAX_CONTRIBUTORS_LISTED
                ]
            },
            "pending_samples": {
                uid: self.core.pending_samples(uid) for uid in self.core.settings.uids
            },
        }
