"""An invite: one line that gets a volunteer into a project from the app alone.

    moehome://join/<project id>?peer=<address>&peer=<address>

It carries the project id and a few peers of the swarm to start from (full libp2p
addresses, percent-encoded). ``moehome owner publish``, ``owner status`` and ``moehome
demo`` print one; the wizard, Project…, ``moehome join`` and ``moehome-tray <invite>``
take one (a bare project id too: the node then asks the peers it already knows).

An invite needs no signature: the project id is a hash of the owner's key and the
project's name (core/project/signed.py), so a manifest found through any peer is checked
against the id itself, and a peer listed in an invite can only fail to help, never pass off
another project. The peers are only a way in.

Parsing is pure and bounded (the text may come from a web page): at most
``MAX_INVITE_CHARS`` characters and ``MAX_PEERS`` peers, each address checked for its
shape before anyone dials it.
"""

from __future__ import annotations

import re
from typing import Annotated, Final
from urllib.parse import parse_qsl, quote, urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from core.control.limits import (
    PROJECT_ID_RULE,
    ProjectId,
    is_project_id,
    normalize_project_id,
)

SCHEME: Final = "moehome"
MAX_INVITE_CHARS: Final = 4096
MAX_PEERS: Final = 8
MAX_PEER_CHARS: Final = 300
#: A dialable libp2p address over TCP that names its peer: what a node prints at start.
_PEER_RE: Final = re.compile(
    r"^/(?:ip4|ip6|dns|dns4|dns6)/[^/\s]{1,253}/tcp/\d{1,5}/p2p/[1-9A-HJ-NP-Za-km-z]{30,100}$"
)
PEER_RULE: Final = (
    "a peer address looks like /ip4/203.0.113.7/tcp/4001/p2p/12D3Koo… "
    "(address, TCP port and the peer's id)"
)
INVITE_RULE: Final = (
    f"paste the invite link (it starts with {SCHEME}://join/) or the project id "
    "(32 characters, 0-9 and a-f)"
)


class InviteError(ValueError):
    """Text that is not an invite; the message says what is wrong, in the user's words."""


def check_peer_address(text: str) -> str:
    if len(text) > MAX_PEER_CHARS or not _PEER_RE.match(text):
        raise ValueError(f"{text[:80]!r}: {PEER_RULE}")
    return text


#: A peer to start from, in a request or an invite.
PeerAddress = Annotated[str, AfterValidator(check_peer_address)]


class Invite(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    project: ProjectId
    peers: Annotated[tuple[PeerAddress, ...], Field(max_length=MAX_PEERS)] = ()

    def link(self) -> str:
        query = "&".join(f"peer={quote(p, safe='')}" for p in self.peers)
        return f"{SCHEME}://join/{self.project}" + (f"?{query}" if query else "")

    def __str__(self) -> str:
        return self.link()


def make_invite(project: str, peers: list[str] | tuple[str, ...]) -> Invite:
    """The invite to ``project`` through ``peers`` (the first MAX_PEERS that have the
    shape of a dialable TCP address; others, like a QUIC address, are left out)."""
    usable = []
    for addr in peers:
        try:
            usable.append(check_peer_address(addr))
        except ValueError:
            continue
    return Invite(project=project, peers=tuple(dict.fromkeys(usable))[:MAX_PEERS])


def parse_invite(text: str) -> Invite:
    """The invite in ``text`` (a link, or a bare project id); InviteError otherwise."""
    if len(text) > MAX_INVITE_CHARS:
        raise InviteError(f"this is too long for an invite ({len(text)} characters)")
    # links wrapped by a mail program or a chat window come back with spaces and newlines
    compact = re.sub(r"\s+", "", text)
    if not compact:
        raise InviteError(INVITE_RULE)
    if "://" not in compact:
        project = normalize_project_id(compact)
        if not is_project_id(project):
            raise InviteError(
                f"{compact[:80]!r} is neither an invite nor a project id: {INVITE_RULE}"
            )
        return Invite(project=project)
    parts = urlsplit(compact)
    if parts.scheme.lower() != SCHEME or parts.netloc.lower() != "join":
        raise InviteError(f"{compact[:80]!r} is not a moehome invite: {INVITE_RULE}")
    project = normalize_project_id(parts.path.strip("/"))
    if not is_project_id(project):
        raise InviteError(f"the invite's project id {project[:80]!r} is wrong: {PROJECT_ID_RULE}")
    try:
        fields = parse_qsl(parts.query, max_num_fields=MAX_PEERS + 8, strict_parsing=False)
    except ValueError as exc:
        raise InviteError(f"the invite has too many parts ({exc})") from exc
    peers = [value for key, value in fields if key == "peer"]  # other keys: a newer app's
    if len(peers) > MAX_PEERS:
        raise InviteError(f"the invite lists {len(peers)} peers; at most {MAX_PEERS} are read")
    try:
        return Invite(project=project, peers=tuple(dict.fromkeys(peers)))
    except ValidationError as exc:
        message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        raise InviteError(f"the invite has a bad peer: {message}") from exc
