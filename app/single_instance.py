"""One tray per user. The first tray holds a lock file in the data folder and listens on a
local socket; a second one (started again from the menu, or by a web page handing over an
invite: ``moehome-tray moehome://join/...``) passes its message to the first and exits.

QLockFile notices a lock left by a crashed tray (its process is gone) and takes it over;
the socket of a crashed tray is removed before listening again."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Final

from PySide6.QtCore import QLockFile, QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

log = logging.getLogger(__name__)

#: What a message may hold: an invite (at most 4096 characters) and a little more.
MAX_MESSAGE_BYTES: Final = 8 * 1024
#: The message that asks the first tray to show itself.
SHOW: Final = "show"


def server_name(data_dir: Path) -> str:
    """A name of this user's data folder (one tray per folder; two users never meet)."""
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]
    return f"moehome-tray-{digest}"


class SingleInstance(QObject):
    #: Another tray handed over a message (an invite, or SHOW).
    message = Signal(str)

    def __init__(self, data_dir: Path) -> None:
        super().__init__()
        data_dir.mkdir(parents=True, exist_ok=True)
        self.name = server_name(data_dir)
        self._lock = QLockFile(str(data_dir / "tray.lock"))
        self._lock.setStaleLockTime(0)  # stale only when its process is gone
        self._server: QLocalServer | None = None

    def claim(self) -> bool:
        """True: this is the first tray (it now listens). False: another one runs."""
        if not self._lock.tryLock(0):
            return False
        QLocalServer.removeServer(self.name)  # a crashed tray's socket
        server = QLocalServer(self)
        server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        if not server.listen(self.name):
            log.warning("cannot listen for other trays: %s", server.errorString())
        server.newConnection.connect(self._accept)
        self._server = server
        return True

    def send(self, text: str, timeout_ms: int = 5000) -> bool:
        """Hand ``text`` to the first tray; False when it does not answer."""
        socket = QLocalSocket()
        socket.connectToServer(self.name)
        if not socket.waitForConnected(timeout_ms):
            log.warning("the running tray does not answer: %s", socket.errorString())
            return False
        socket.write(text.encode()[:MAX_MESSAGE_BYTES] + b"\n")
        ok = socket.waitForBytesWritten(timeout_ms)
        socket.disconnectFromServer()
        return ok

    def release(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self._lock.unlock()

    def _accept(self) -> None:
        assert self._server is not None
        while (socket := self._server.nextPendingConnection()) is not None:
            buffer = bytearray()

            def read(socket: QLocalSocket = socket, buffer: bytearray = buffer) -> None:
                buffer.extend(bytes(socket.readAll().data()))
                if len(buffer) > MAX_MESSAGE_BYTES:
                    log.warning("dropping an over-long message from another tray")
                    socket.abort()
                    return
                if b"\n" in buffer:
                    line = bytes(buffer).split(b"\n", 1)[0].decode(errors="replace")
                    socket.disconnectFromServer()
                    log.info("handed over: %s", line.strip())
                    self.message.emit(line.strip())

            socket.readyRead.connect(read)
            socket.disconnected.connect(socket.deleteLater)
            if socket.bytesAvailable():
                read()
