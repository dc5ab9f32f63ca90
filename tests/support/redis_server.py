"""A throw-away redis-server of a test's own, so the test can stop, crash and restart it."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

from tests.conftest import wait_for


class RedisServer:
    """redis-server on loopback, in ``directory``.

    Without persistence by default: a restart comes back empty. ``appendfsync`` turns the
    append-only file on with that policy (``"always"``: every write is on disk before Redis
    answers it, so a SIGKILL loses nothing it acknowledged and a restart reloads it).
    """

    def __init__(self, directory: Path, port: int | None = None, *, appendfsync: str | None = None) -> None:
        if port is None:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        self.port = port
        self.directory = directory
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        appendonly = ["yes", "--appendfsync", self.appendfsync] if self.appendfsync else ["no"]
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                *appendonly,
            ],
            cwd=self.directory,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self.answers, timeout=30, message=f"redis-server on port {self.port} to answer")

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM, as an operator stopping it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None

    def crash(self) -> None:
        """SIGKILL: what it held in memory is gone."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None
