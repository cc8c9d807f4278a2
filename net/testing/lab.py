"""A network lab on one Linux machine: namespaces for a public network and home networks
behind NAT routers, built with ``ip``, ``nft`` and ``tc``, removed on exit.

The shape (every address from 198.18.0.0/15, reserved for benchmarks; nothing is routed
out of the machine: no namespace has a link to the machine's own network)::

    public hosts 198.18.0.10+i ──┐
                                 ├── bridge "inet" (198.18.0.0/24)
    router k WAN 198.18.0.100+k ─┘
        │ nftables masquerade (port-preserving, like most home routers; or "symmetric":
        │ a random port per connection, where hole punching fails)
    router k LAN 198.18.(1+k).1 ── home k hosts 198.18.(1+k).10+j

A home's uplink can be rate-limited (``tc tbf`` on the router's WAN side), cut and
restored, and its public address changed, as a volunteer's network changes.

Needs root (network namespaces) and the ``ip``, ``nft`` and ``tc`` commands. Every
namespace's name starts with ``mhlab<pid>-``; :func:`remove_stale` removes those of
processes that died without cleaning up.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from net.testing import lab_upnp

log = logging.getLogger(__name__)

PUBLIC_NET = "198.18.0"
#: the public network's own address: the STUN server routers with UPnP ask
STUN_IP = f"{PUBLIC_NET}.1"
NatKind = Literal["cone", "symmetric"]
_PREFIX = "mhlab"
_NAME_RE = re.compile(rf"^{_PREFIX}(\d+)-")
#: labs of this process are numbered, so two at once get different namespaces
_serials = itertools.count(1)


class LabError(RuntimeError):
    """The lab cannot be built here (not root, a command missing, the kernel refused)."""


@dataclass(frozen=True)
class Home:
    """A home network: ``hosts`` machines behind one NAT router."""

    name: str
    hosts: int = 1
    nat: NatKind = "cone"
    #: upload of the home line in Mbit/s (None: as fast as the machine goes)
    uplink_mbit: float | None = None
    #: the router forwards ports on request (UPnP IGD and NAT-PMP: miniupnpd)
    upnp: bool = False


@dataclass(frozen=True)
class LabHost:
    """One machine of the lab: a namespace and its address."""

    name: str
    namespace: str
    ip: str
    home: str | None  # None on the public network

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *args]


def missing_requirements() -> str | None:
    """Why a lab cannot be built here, or None when it can."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, e.g. with sudo)"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            return f"the '{tool}' command is missing (install the {package} package)"
    return _namespaces_refused()


@functools.cache
def _namespaces_refused() -> str | None:
    """Whether the kernel lets us create a namespace (a container may not)."""
    probe = f"{_PREFIX}{os.getpid()}-probe"
    try:
        _run(["ip", "netns", "add", probe])
    except LabError as exc:
        return f"this system refuses network namespaces ({exc})"
    _delete_namespace(probe)
    return None


def _run(args: Sequence[str], *, stdin: str | None = None) -> str:
    try:
        done = subprocess.run(
            list(args), input=stdin, capture_output=True, text=True, check=False, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"{' '.join(args)}: {exc}") from exc
    if done.returncode != 0:
        raise LabError(f"{' '.join(args)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def _namespaces() -> list[str]:
    out = _run(["ip", "netns", "list"])
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_namespace(namespace: str) -> None:
    """Kill what runs inside, then delete (a namespace lives on while a process holds
    it, and its veth ends with it)."""
    with contextlib.suppress(LabError):
        pids = _run(["ip", "netns", "pids", namespace]).split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
    with contextlib.suppress(LabError):
        _run(["ip", "netns", "delete", namespace])


def remove_stale() -> list[str]:
    """Delete lab namespaces whose creating process is gone; returns their names."""
    removed = []
    for namespace in _namespaces():
        match = _NAME_RE.match(namespace)
        if match and not _pid_alive(int(match.group(1))):
            _delete_namespace(namespace)
            removed.append(namespace)
    return removed


@dataclass
class Lab:
    """A built topology. Use :func:`network_lab` to build one and remove it afterwards."""

    prefix: str
    public: dict[str, LabHost] = field(default_factory=dict)
    homes: dict[str, Home] = field(default_factory=dict)
    home_hosts: dict[str, list[LabHost]] = field(default_factory=dict)
    _routers: dict[str, int] = field(default_factory=dict)  # home -> index k
    _wan_ip: dict[str, str] = field(default_factory=dict)
    _namespaces: list[str] = field(default_factory=list)
    _upnp: dict[str, subprocess.Popen[str]] = field(default_factory=dict)  # home -> daemon
    _helpers: list[subprocess.Popen[str]] = field(default_factory=list)

    # ---- what tests and the demo use

    def host(self, name: str) -> LabHost:
        """A public host by name, or ``"<home>/<j>"`` for home machine j."""
        if name in self.public:
            return self.public[name]
        home, _, index = name.partition("/")
        try:
            return self.home_hosts[home][int(index or 0)]
        except (KeyError, ValueError, IndexError):
            raise KeyError(f"no host {name!r} in the lab") from None

    def public_ip_of(self, home: str) -> str:
        """The address the public network sees for ``home`` (its router's WAN side)."""
        return self._wan_ip[home]

    def router_namespace(self, home: str) -> str:
        return f"{self.prefix}-r{self._routers[home]}"

    def set_uplink(self, home: str, mbit: float | None) -> None:
        """Rate-limit what ``home`` sends to the public network (None: no limit)."""
        ns, dev = self.router_namespace(home), "wan"
        with contextlib.suppress(LabError):
            _run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"])
        if mbit is not None:
            rate = f"{int(mbit * 1000)}kbit"
            burst = max(32_000, int(mbit * 1e6 / 8 / 100))  # ~10 ms of the line
            _run(
                [
                    *("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root"),
                    *("tbf", "rate", rate, "burst", str(burst), "latency", "100ms"),
                ]
            )

    def cut(self, home: str) -> None:
        """The home's line goes down (its router's WAN link)."""
        _run(["ip", "-n", self.router_namespace(home), "link", "set", "wan", "down"])

    def restore(self, home: str) -> None:
        _run(["ip", "-n", self.router_namespace(home), "link", "set", "wan", "up"])

    def renumber(self, home: str) -> str:
        """The provider gives ``home`` a new public address (its NAT mappings are lost,
        as when a router restarts); returns the new address."""
        ns, k = self.router_namespace(home), self._routers[home]
        old = self._wan_ip[home]
        first, second = f"{PUBLIC_NET}.{100 + k}", f"{PUBLIC_NET}.{150 + k}"
        new = second if old == first else first
        _run(["ip", "-n", ns, "addr", "del", f"{old}/24", "dev", "wan"])
        _run(["ip", "-n", ns, "addr", "add", f"{new}/24", "dev", "wan"])
        # masquerade forgets its mappings when the address goes; the rules are loaded
        # again so the router behaves as one that restarted
        _run(["ip", "netns", "exec", ns, "nft", "flush", "ruleset"])
        _run(["ip", "netns", "exec", ns, "nft", "-f", "-"], stdin=_nat_rules(self.homes[home]))
        self._wan_ip[home] = new
        if home in self._upnp:  # a router that restarted starts its daemon again
            _stop(self._upnp.pop(home))
            self._start_upnp(home)
        return new

    def all_hosts(self) -> list[LabHost]:
        return [*self.public.values(), *(h for hosts in self.home_hosts.values() for h in hosts)]

    # ---- building

    def _add_namespace(self, name: str) -> str:
        ns = f"{self.prefix}-{name}"
        _run(["ip", "netns", "add", ns])
        self._namespaces.append(ns)
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        return ns

    def _veth(self, ns_a: str, dev_a: str, ns_b: str, dev_b: str) -> None:
        # created inside ns_a, so no interface ever appears in the machine's namespace
        _run(
            [
                *("ip", "-n", ns_a, "link", "add", dev_a, "type", "veth"),
                *("peer", "name", dev_b, "netns", ns_b),
            ]
        )
        _run(["ip", "-n", ns_a, "link", "set", dev_a, "up"])
        _run(["ip", "-n", ns_b, "link", "set", dev_b, "up"])

    def build(self, public: Sequence[str], homes: Sequence[Home]) -> None:
        inet = self._add_namespace("inet")
        _run(["ip", "-n", inet, "link", "add", "inet", "type", "bridge"])
        _run(["ip", "-n", inet, "link", "set", "inet", "up"])
        if any(home.upnp for home in homes):
            why_not = lab_upnp.missing()
            if why_not is not None:
                raise LabError(f"a home with UPnP needs miniupnpd: {why_not}")
            # the internet's STUN server, on the public network's bridge
            _run(["ip", "-n", inet, "addr", "add", f"{STUN_IP}/24", "dev", "inet"])
            self._helpers.append(lab_upnp.start_stun(["ip", "netns", "exec", inet], STUN_IP))
        for i, name in enumerate(public):
            ns = self._add_namespace(f"p{i}")
            self._veth(inet, f"p{i}", ns, "eth0")
            _run(["ip", "-n", inet, "link", "set", f"p{i}", "master", "inet"])
            ip = f"{PUBLIC_NET}.{10 + i}"
            _run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"])
            self.public[name] = LabHost(name, ns, ip, None)
        for k, home in enumerate(homes):
            if home.name in self.homes or "/" in home.name:
                raise LabError(f"home names must be unique and without '/': {home.name!r}")
            router = self._add_namespace(f"r{k}")
            self._routers[home.name] = k
            self.homes[home.name] = home
            self._veth(inet, f"r{k}", router, "wan")
            _run(["ip", "-n", inet, "link", "set", f"r{k}", "master", "inet"])
            wan = f"{PUBLIC_NET}.{100 + k}"
            _run(["ip", "-n", router, "addr", "add", f"{wan}/24", "dev", "wan"])
            self._wan_ip[home.name] = wan
            lan_net = f"198.18.{1 + k}"
            _run(["ip", "-n", router, "link", "add", "lan", "type", "bridge"])
            _run(["ip", "-n", router, "link", "set", "lan", "up"])
            _run(["ip", "-n", router, "addr", "add", f"{lan_net}.1/24", "dev", "lan"])
            _run(["ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
            _run(["ip", "netns", "exec", router, "nft", "-f", "-"], stdin=_nat_rules(home))
            hosts = []
            for j in range(home.hosts):
                ns = self._add_namespace(f"h{k}x{j}")
                self._veth(router, f"h{j}", ns, "eth0")
                _run(["ip", "-n", router, "link", "set", f"h{j}", "master", "lan"])
                ip = f"{lan_net}.{10 + j}"
                _run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"])
                _run(["ip", "-n", ns, "route", "add", "default", "via", f"{lan_net}.1"])
                hosts.append(LabHost(f"{home.name}/{j}", ns, ip, home.name))
            self.home_hosts[home.name] = hosts
            if home.uplink_mbit is not None:
                self.set_uplink(home.name, home.uplink_mbit)
            if home.upnp:
                self._start_upnp(home.name)

    def _start_upnp(self, home: str) -> None:
        ns = self.router_namespace(home)
        _run(["ip", "netns", "exec", ns, "nft", "-f", "-"], stdin=lab_upnp.NFT_RULES)
        try:
            self._upnp[home] = lab_upnp.start_miniupnpd(["ip", "netns", "exec", ns], STUN_IP)
        except RuntimeError as exc:
            raise LabError(str(exc)) from exc

    def upnp_mappings(self, home: str) -> str:
        """The port forwards miniupnpd made on ``home``'s router (nft rules)."""
        ns = self.router_namespace(home)
        return _run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "nft",
                "list",
                "chain",
                "inet",
                "miniupnpd",
                "prerouting_miniupnpd",
            ]
        )

    def remove(self) -> None:
        for proc in [*self._upnp.values(), *self._helpers]:
            _stop(proc)
        self._upnp.clear()
        self._helpers.clear()
        for ns in reversed(self._namespaces):
            _delete_namespace(ns)
        self._namespaces.clear()


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()  # miniupnpd removes its rules on SIGTERM
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _nat_rules(home: Home) -> str:
    """A home router: masquerade what leaves through the WAN side; from the WAN side, let
    in only what answers a connection from inside (what a NAT gives for free), and drop
    the rest without a word, as home routers do (an RST from the router would kill the
    other side's half of a simultaneous open). Machines of the home reach each other:
    where br_netfilter is loaded, frames between two ports of the LAN bridge pass this
    forward chain too (measured: without the last rule, two machines of one home could
    not connect, and their peers went through a relay)."""
    # "cone": Linux keeps the inside port when it is free (endpoint-independent mapping
    # in practice). "symmetric": a random port for every connection, so the address a
    # peer observed is useless to anyone else and hole punching fails.
    masquerade = "masquerade random,fully-random" if home.nat == "symmetric" else "masquerade"
    return f"""
table ip nat {{
  chain postrouting {{ type nat hook postrouting priority srcnat; oifname "wan" {masquerade}; }}
}}
table ip filter {{
  chain input {{
    type filter hook input priority 0; policy accept;
    iifname "wan" ct state established,related accept
    iifname "wan" drop
  }}
  chain forward {{
    type filter hook forward priority 0; policy drop;
    ct state established,related accept
    iifname "lan" oifname "wan" accept
    iifname != "wan" oifname != "wan" accept
  }}
}}
"""


@contextlib.contextmanager
def network_lab(public: Sequence[str], homes: Sequence[Home]) -> Iterator[Lab]:
    """Build the topology, yield it, and remove every namespace (and what runs inside)
    afterwards, also when the body fails."""
    why_not = missing_requirements()
    if why_not is not None:
        raise LabError(why_not)
    remove_stale()
    lab = Lab(prefix=f"{_PREFIX}{os.getpid()}-{next(_serials)}")
    try:
        lab.build(public, homes)
        yield lab
    finally:
        lab.remove()
