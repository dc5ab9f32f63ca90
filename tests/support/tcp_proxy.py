"""A TCP forwarder on 127.0.0.1 that a test can cut and restore: one client's network partition.

:meth:`TcpProxy.cut` closes every forwarded connection and stops listening, so the client
sees its connections drop and new ones refused, as across a broken network path; the
server and its other clients carry on. :meth:`TcpProxy.restore` listens again on the same port.
:meth:`TcpProxy.hold` stops forwarding (what is sent meanwhile waits in the forwarder) and
:meth:`TcpProxy.drop` resets every connection, discarding what was held: a lagging link
that then breaks.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class TcpProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._flowing = threading.Event()
        self._flowing.set()
        self._dropped = False
        self.port = 0
        self._listen()

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut: the listener was closed
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, server))
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self._flowing.wait()
                if self._dropped:
                    return
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self._lock:
                self._sockets.difference_update((source, target))

    def cut(self) -> None:
        if self._listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone would leave the
            # socket listening until that call returned.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def hold(self) -> None:
        """Stop forwarding: bytes received from now on wait in the forwarder."""
        self._flowing.clear()

    def drop(self) -> None:
        """Reset every connection (no FIN, no flush): what :meth:`hold` kept is never delivered."""
        self._dropped = True
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
        self._flowing.set()
        self.cut()

    def restore(self) -> None:
        """Listen again (after :meth:`cut` or :meth:`drop`) and forward what new connections send."""
        self._dropped = False
        if self._listener is None:
            self._listen()

    def close(self) -> None:
        self.cut()
