"""A TCP relay whose outgoing connections come from another loopback address (127.0.0.2).

Tests of source-IP rules need a client the broker sees at an address other
than 127.0.0.1; clients cannot choose their source address, so they connect
to this relay, which connects onwards from ``source`` and copies bytes.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class SourceRelay:
    def __init__(self, target: tuple[str, int], source: str = "127.0.0.2") -> None:
        self.target, self.source = target, source
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            upstream.bind((self.source, 0))
            try:
                upstream.connect(self.target)
            except OSError:
                client.close()
                upstream.close()
                continue
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._copy, args=(a, b), daemon=True).start()

    @staticmethod
    def _copy(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
