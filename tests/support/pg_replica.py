"""A throw-away PostgreSQL primary and streaming standby of a test's own, for failover tests.

Both clusters live in one temporary directory and listen on 127.0.0.1 only; nothing of the
machine's own PostgreSQL is touched. ``initdb`` refuses to run as root, so under root every
server command runs as the ``postgres`` user (``runuser``) and the directory is handed to it.

The standby is a ``pg_basebackup -R`` copy of the primary. With ``synchronous=True`` the
primary waits for the standby's flush before a commit returns (``synchronous_standby_names =
'*'``), so a commit a client saw acknowledged is on the standby. The standby's own
``synchronous_standby_names`` is empty: once promoted it has no standby of its own to wait for
(left at ``'*'``, every commit on the new primary would hang).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from .tcp_proxy import TcpProxy

#: Where the test's clusters listen (the first two free ports from here up).
PORT_RANGE = range(5460, 5470)
DATABASE = "jobguard_failover"


def bin_dir() -> Path | None:
    """The newest installed PostgreSQL's server binaries (Debian layout), or PATH's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def missing_reason() -> str | None:
    """Why the failover tests cannot build their clusters here, or None."""
    directory = bin_dir()
    if directory is None:
        return "needs PostgreSQL's initdb, pg_basebackup and pg_ctl: apt-get install postgresql"
    for name in ("initdb", "pg_basebackup", "pg_ctl"):
        if not os.access(directory / name, os.X_OK):
            return f"needs {directory / name}"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root needs runuser to start PostgreSQL as the postgres user"
    return None


def free_ports(count: int) -> list[int]:
    ports = []
    for port in PORT_RANGE:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"no {count} free ports in {PORT_RANGE}")


class ReplicatedPostgres:
    """A primary and a streaming standby on 127.0.0.1; :meth:`fail_over` stops one, promotes the other."""

    def __init__(self, *, synchronous: bool = True, lagging_link: bool = False) -> None:
        directory = bin_dir()
        if directory is None:
            raise RuntimeError(missing_reason())
        self.bin = directory
        self.synchronous = synchronous
        self.root = Path(tempfile.mkdtemp(prefix="jobguard-failover-"))
        self.primary_port, self.standby_port = free_ports(2)
        self.primary = self.root / "primary"
        self.standby = self.root / "standby"
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, user="postgres", group="postgres")
        self.running: set[Path] = set()
        #: With ``lagging_link``, the standby streams through a forwarder a test can hold and
        #: drop (:class:`~tests.support.tcp_proxy.TcpProxy`): a standby that falls behind.
        self.with_link = lagging_link
        self.link: TcpProxy | None = None

    # -- connection settings -------------------------------------------------------------

    @property
    def ports(self) -> str:
        return f"{self.primary_port},{self.standby_port}"

    def conninfo(self, *, port: int | None = None, dbname: str = DATABASE) -> str:
        """The multi-host conninfo a client fails over with (or one server's, with ``port``)."""
        if port is not None:
            return f"host=127.0.0.1 port={port} user=postgres dbname={dbname} connect_timeout=2"
        return (
            f"host=127.0.0.1,127.0.0.1 port={self.ports} user=postgres dbname={dbname} "
            "target_session_attrs=read-write connect_timeout=2"
        )

    # -- life cycle ----------------------------------------------------------------------

    def _run(self, *command: str, timeout: float = 120) -> str:
        argv = [str(self.bin / command[0]), *command[1:]]
        if self._as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False, cwd=self.root)
        if done.returncode != 0:
            stderr = done.stderr.decode(errors="replace")[-2000:]
            raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}: {stderr}")
        return done.stdout.decode(errors="replace")

    def _pg_ctl(self, data: Path, *args: str) -> None:
        self._run("pg_ctl", "-D", str(data), "-l", str(data) + ".log", "-w", "-t", "60", *args)

    def start(self) -> None:
        """initdb, start the primary, copy it to the standby, start that, create the database."""
        self._run(
            "initdb", "-D", str(self.primary), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"
        )
        settings = [
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{self.root}'",
            f"port = {self.primary_port}",
            "wal_level = replica",
            "max_wal_senders = 5",
            "max_connections = 200",
            "shared_buffers = 64MB",
            # The clusters die with the test: skip fsync (a PostgreSQL crash, the only kind the
            # test causes, loses nothing the OS already holds), keep the replication semantics.
            "fsync = off",
            "full_page_writes = off",
            "hot_standby = on",
            "wal_receiver_status_interval = 1s",
            f"synchronous_standby_names = '{'*' if self.synchronous else ''}'",
        ]
        with open(self.primary / "postgresql.conf", "a") as conf:
            conf.write("\n".join(settings) + "\n")
        with open(self.primary / "pg_hba.conf", "a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 trust\n")
        self._pg_ctl(self.primary, "start")
        self.running.add(self.primary)
        self._run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary_port), "-U", "postgres",
            "-D", str(self.standby), "-R", "-X", "stream", "--no-sync",
        )  # fmt: skip
        with open(self.standby / "postgresql.conf", "a") as conf:
            conf.write(f"port = {self.standby_port}\nsynchronous_standby_names = ''\n")
        if self.with_link:
            self.link = TcpProxy(self.primary_port)
            # The last setting in postgresql.auto.conf wins over the one pg_basebackup -R wrote.
            with open(self.standby / "postgresql.auto.conf", "a") as auto:
                auto.write(f"primary_conninfo = 'host=127.0.0.1 port={self.link.port} user=postgres'\n")
        self._pg_ctl(self.standby, "start")
        self.running.add(self.standby)
        import psycopg

        deadline = time.monotonic() + 60
        wanted = "sync" if self.synchronous else "async"
        admin = self.conninfo(port=self.primary_port, dbname="postgres")
        with psycopg.connect(admin, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
                ).fetchone()
                if row and row[0] == wanted:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby did not start streaming ({wanted}) within 60 s: {row}")
                time.sleep(0.1)
            conn.execute(f"CREATE DATABASE {DATABASE}")

    def stop_primary_immediately(self) -> None:
        """``pg_ctl stop -m immediate``: no shutdown checkpoint, every connection cut at once."""
        self._pg_ctl(self.primary, "stop", "-m", "immediate")
        self.running.discard(self.primary)

    def promote_standby(self) -> None:
        self._pg_ctl(self.standby, "promote")

    def stop_primary(self) -> None:
        """Stop the primary (fast mode); :meth:`start_primary` brings it back as the primary."""
        self._pg_ctl(self.primary, "stop", "-m", "fast")
        self.running.discard(self.primary)

    def start_primary(self) -> None:
        self._pg_ctl(self.primary, "start")
        self.running.add(self.primary)

    def start_old_primary_alone(self) -> None:
        """Start the stopped primary again, on its own (crash recovery, no standby), to read it.

        Only once no client can reach it by the multi-host settings any more: it accepts writes.
        """
        self._pg_ctl(self.primary, "start")
        self.running.add(self.primary)

    def stop(self) -> None:
        """Stop whatever still runs and remove both clusters."""
        if self.link is not None:
            self.link.close()
        for data in list(self.running):
            try:
                self._pg_ctl(data, "stop", "-m", "immediate")
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            self.running.discard(data)
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self, which: str) -> str:
        path = Path(str(self.primary if which == "primary" else self.standby) + ".log")
        return path.read_text(errors="replace") if path.exists() else ""
