"""A throw-away RabbitMQ node of a test's own, so the test can SIGKILL and restart it.

The machine's broker (5672) is shared with other runs and cannot be restarted; this node has its
own name (``jobguard-t14-<port>@localhost``), AMQP and distribution ports, and its data
(``RABBITMQ_MNESIA_BASE``), logs, config and plugins list in the test's directory, so a restart
comes back with the durable queues and persistent messages it had. No plugin is enabled: a start
takes a few seconds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import wait_for

#: Debian's /usr/sbin/rabbitmq-server re-runs itself as the rabbitmq user under root (su), which
#: could not write the test's directory: the script it wraps is run instead when present.
_SCRIPTS = ("/usr/lib/rabbitmq/bin/rabbitmq-server",)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def server_script() -> str | None:
    """The rabbitmq-server start script, or None when RabbitMQ is not installed."""
    for script in _SCRIPTS:
        if os.access(script, os.X_OK):
            return script
    return shutil.which("rabbitmq-server")


def _group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # The fields after the command's closing parenthesis: state, ppid, pgrp, ...
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                members.append(int(entry.name))
    return members


def _alive(pid: int) -> bool:
    """``pid`` still runs (a zombie has let go of its ports: not alive)."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


class RabbitMQNode:
    """``rabbitmq-server`` on loopback ports of its own, data in ``directory``."""

    def __init__(self, directory: Path, script: str) -> None:
        self.script = script
        self.port = _free_port()
        self.dist_port = _free_port()
        self.name = f"jobguard-t14-{self.port}@localhost"
        self.directory = directory
        self.log = directory / "rabbitmq-server.log"
        (directory / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n")
        (directory / "enabled_plugins").write_text("[].\n")
        (directory / "rabbitmq-env.conf").write_text("")  # not the machine's: it names the shared node
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def _environment(self) -> dict[str, str]:
        d = self.directory
        return {
            **os.environ,
            "HOME": str(d),  # the node's Erlang cookie, apart from the machine's
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(d / "rabbitmq.pid"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def start(self, timeout: float = 120) -> None:
        """Start the node and wait until it takes an AMQP connection."""
        with self.log.open("ab") as log:
            # A session of its own: kill() reaches the script, beam and its helpers, never pytest.
            self.proc = subprocess.Popen(
                [self.script],
                env=self._environment(),
                cwd=self.directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(self.answers, timeout, message=f"RabbitMQ node {self.name} to take a connection")

    def answers(self) -> bool:
        import pika

        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(
                f"RabbitMQ node {self.name} exited with {self.proc.returncode}: see {self.log}"
            )
        try:
            params = pika.URLParameters(self.url)
            params.connection_attempts, params.socket_timeout = 1, 2
            pika.BlockingConnection(params).close()
            return True
        except Exception:  # not listening yet, or still booting
            return False

    def kill(self) -> None:
        """SIGKILL to the node's processes (beam among them): no clean shutdown.

        Returns once they are all gone: a beam still exiting holds its ports and its name, and
        a node started meanwhile would find the name taken and give up."""
        assert self.proc is not None
        group = _group(self.proc.pid)
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        wait_for(
            lambda: not any(_alive(pid) for pid in group), 60, message=f"{self.name}'s processes to exit"
        )

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), SIGKILL if it has not ended within a minute."""
        if self.proc is None or self.proc.poll() is not None:
            return
        group = _group(self.proc.pid)
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
            wait_for(lambda: not any(_alive(pid) for pid in group), 60, message=f"{self.name} to stop")
        except (subprocess.TimeoutExpired, pytest.fail.Exception):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
