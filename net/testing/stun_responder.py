"""The network lab's STUN responder (RFC 5389 Binding): MAPPED-ADDRESS and
XOR-MAPPED-ADDRESS of each request's sender, for the lab's UPnP router
(net/testing/lab_upnp.py). Run as a script by its path, in the lab's "internet"
namespace, with only the standard library (no package import in the namespace):

    python net/testing/stun_responder.py IP PORT READY_FD

Once bound it writes a newline to READY_FD, a pipe its parent handed it, and closes it
(s6's readiness notification): the parent's start handshake, stdout left alone.
"""

from __future__ import annotations

import os
import socket
import struct
import sys

MAGIC = 0x2112A442
BINDING_REQUEST = 0x0001
BINDING_RESPONSE = 0x0101
MAPPED_ADDRESS = 0x0001
XOR_MAPPED_ADDRESS = 0x0020


def answer(request: bytes, ip: str, port: int) -> bytes | None:
    """The Binding response to ``request`` from ``ip``:``port``; None for anything else."""
    if len(request) < 20 or struct.unpack("!H", request[:2])[0] != BINDING_REQUEST:
        return None
    cookie, tid, raw = struct.unpack("!I", request[4:8])[0], request[8:20], socket.inet_aton(ip)
    attrs = struct.pack("!HHBBH", MAPPED_ADDRESS, 8, 0, 1, port) + raw
    if cookie == MAGIC:
        xip = struct.pack("!I", struct.unpack("!I", raw)[0] ^ MAGIC)
        attrs += struct.pack("!HHBBH", XOR_MAPPED_ADDRESS, 8, 0, 1, port ^ (MAGIC >> 16)) + xip
    return struct.pack("!HHI", BINDING_RESPONSE, len(attrs), cookie) + tid + attrs


def main(argv: list[str]) -> None:
    ip, port, ready = argv[0], int(argv[1]), int(argv[2])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, port))
    os.write(ready, b"\n")
    os.close(ready)
    while True:
        request, (ip, port) = s.recvfrom(2048)
        response = answer(request, ip, port)
        if response is not None:
            s.sendto(response, (ip, port))


if __name__ == "__main__":
    main(sys.argv[1:])
