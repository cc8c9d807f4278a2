"""A home router of the network lab that offers port mapping: the real miniupnpd
(Debian: miniupnpd-nftables) in the router's namespace, speaking UPnP IGD and NAT-PMP,
and a STUN responder on the lab's "internet" for it to learn its public address.

miniupnpd refuses to forward ports while its WAN address is a reserved one (as
198.18.0.0/15 is) unless STUN says the router is not itself behind a NAT: it sends four
Binding requests from four sockets and wants every answer from the address it asked,
showing its own address and ports. net/testing/stun_responder.py does just that (it
ignores the "change address" flags, as a server with one address must).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: where the lab's STUN responder listens (on the bridge of the public network)
STUN_PORT = 3478
#: the STUN responder, run as a script by its path (standard library only)
STUN_RESPONDER = Path(__file__).with_name("stun_responder.py")

_CONFIG = """ext_ifname=wan
listening_ip=lan
enable_natpmp=yes
enable_upnp=yes
secure_mode=yes
system_uptime=yes
ext_perform_stun=yes
ext_stun_host={stun_ip}
ext_stun_port={stun_port}
lease_file={folder}/leases
upnp_table_name=miniupnpd
upnp_nat_table_name=miniupnpd
upnp_forward_chain=miniupnpd
upnp_nat_chain=prerouting_miniupnpd
upnp_nat_postrouting_chain=postrouting_miniupnpd
uuid=3d3cec3a-8cf0-11e0-98ee-001a6bd2d07b
allow 1024-65535 198.18.0.0/15 1024-65535
deny 0-65535 0.0.0.0/0 0-65535
"""

#: The chains miniupnpd fills (its forward chain accepts by default: the lab's own
#: filter decides the rest), and the lab's forward chain letting in what a mapping
#: redirected (a packet must pass every base chain of its hook).
NFT_RULES = """
table inet miniupnpd {
  chain forward { type filter hook forward priority -1; policy accept; jump miniupnpd; }
  chain miniupnpd { }
  chain prerouting {
    type nat hook prerouting priority -100; policy accept; jump prerouting_miniupnpd;
  }
  chain postrouting {
    type nat hook postrouting priority 100; policy accept; jump postrouting_miniupnpd;
  }
  chain prerouting_miniupnpd { }
  chain postrouting_miniupnpd { }
}
add rule ip filter forward iifname "wan" ct status dnat accept
"""


#: what miniupnpd logs once STUN said yes and every protocol listens
_READY = ("Port forwarding is now enabled", "Listening for NAT-PMP")


def missing() -> str | None:
    if shutil.which("miniupnpd") is None:
        return "the 'miniupnpd' command is missing (install the miniupnpd-nftables package)"
    return None


def start_stun(prefix: list[str], ip: str) -> subprocess.Popen[str]:
    """The STUN responder in the lab's internet (``prefix``: the ``ip netns exec`` of
    its namespace), returned once bound: it writes a newline to the pipe it is handed;
    the pipe's end without one is a responder that died first."""
    ready, notify = os.pipe()
    with os.fdopen(ready, "rb") as pipe:
        try:
            proc = subprocess.Popen(
                [*prefix, sys.executable, str(STUN_RESPONDER), ip, str(STUN_PORT), str(notify)],
                pass_fds=(notify,),
                text=True,
            )
        finally:
            os.close(notify)  # the responder holds the only writing end now
        if pipe.read(1) != b"\n":
            raise RuntimeError(f"the lab's STUN responder did not start (rc {proc.wait()})")
    return proc


def start_miniupnpd(
    prefix: list[str], stun_ip: str, *, timeout: float = 15.0
) -> subprocess.Popen[str]:
    """miniupnpd in the router (``prefix``: the ``ip netns exec`` of its namespace),
    returned once it answers; its chains must be loaded (:data:`NFT_RULES`)."""
    folder = Path(tempfile.mkdtemp(prefix="moehome-upnp-"))
    config = folder / "miniupnpd.conf"
    config.write_text(_CONFIG.format(stun_ip=stun_ip, stun_port=STUN_PORT, folder=folder))
    log = folder / "miniupnpd.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*prefix, "miniupnpd", "-d", "-f", str(config), "-P", str(folder / "pid")],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    deadline = time.monotonic() + timeout
    while not all(w in log.read_text(errors="replace") for w in _READY):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"miniupnpd did not start: {log.read_text(errors='replace')[-800:]}")
        time.sleep(0.1)
    return proc
