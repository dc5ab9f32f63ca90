"""A throw-away PgBouncer of a test's own, in transaction pooling mode, in front of the test PostgreSQL.

Debian's pgbouncer (1.18) refuses to run as root, so under root it drops to the
``postgres`` user (``--user``); its files then live in a directory that user can read.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from tests.conftest import wait_for

#: Where Debian installs it; PATH is searched first.
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def available() -> bool:
    return os.access(PGBOUNCER, os.X_OK)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PgBouncer:
    """pgbouncer on 127.0.0.1:<free port>, ``pool_mode = transaction``, forwarding every database."""

    def __init__(
        self,
        *,
        server_host: str = "127.0.0.1",
        server_port: int = 5432,
        user: str = "postgres",
        pool_size: int = 10,
        port: int | None = None,
    ) -> None:
        # Its own directory under /tmp (a test's tmp_path is closed to other users).
        self.directory = Path(tempfile.mkdtemp(prefix="jobguard-pgbouncer-"))
        self.port = port or free_port()
        self.server_host = server_host
        self.server_port = server_port
        self.user = user
        self.pool_size = pool_size
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.directory / "pgbouncer.log"

    def _write_config(self) -> Path:
        auth = self.directory / "userlist.txt"
        auth.write_text(f'"{self.user}" ""\n')
        ini = self.directory / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={self.server_host} port={self.server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.directory}\n"
            "auth_type = trust\n"
            f"auth_file = {auth}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 500\n"
            # Clients (Django, the listener) announce these; PgBouncer must not refuse them.
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.log_path}\n"
            f"pidfile = {self.directory / 'pgbouncer.pid'}\n"
            f"admin_users = {self.user}\n"
            "server_reset_query =\n"
        )
        return ini

    def start(self) -> None:
        ini = self._write_config()
        command = [PGBOUNCER, "--quiet", str(ini)]
        if os.geteuid() == 0:
            # PgBouncer will not run as root: hand the directory to the postgres user.
            shutil.chown(self.directory, user="postgres")
            for path in self.directory.iterdir():
                shutil.chown(path, user="postgres")
            command[1:1] = ["--user", "postgres"]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_for(self.answers, timeout=30, message=f"pgbouncer on port {self.port} to accept connections")

    def answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            raise RuntimeError(f"pgbouncer exited with {self.proc.returncode}: {log[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def show(self, what: str) -> list[tuple[object, ...]]:
        """``SHOW <what>`` on the admin console (e.g. ``pools``): rows as tuples."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=self.user, dbname="pgbouncer", autocommit=True
        ) as conn:
            return list(conn.execute(f"SHOW {what}", prepare=False).fetchall())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        shutil.rmtree(self.directory, ignore_errors=True)
