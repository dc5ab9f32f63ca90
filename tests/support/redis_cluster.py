"""A throw-away Redis Cluster (three masters, no replicas) on free loopback ports.

Plus the django-redis connection factory the suite reaches it through: django-redis 7 has
no Cluster client, but jobguard's locks and versioned cache writes only need
``get_redis_connection()`` to hand back a client that routes by key, which
``redis.cluster.RedisCluster`` is.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from django_redis.pool import ConnectionFactory

from tests.conftest import wait_for

NODES = 3


def available() -> bool:
    return bool(shutil.which("redis-server") and shutil.which("redis-cli"))


def _free_port() -> int:
    # Cluster nodes also listen on port + 10000 (the cluster bus): keep both below 65536.
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port + 10000 < 65536:
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


class RedisCluster:
    """``redis-server --cluster-enabled yes`` x3, joined with ``redis-cli --cluster create``."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="jobguard-redis-cluster-"))
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self) -> None:
        for index in range(NODES):
            port = _free_port()
            node_dir = self.directory / str(port)
            node_dir.mkdir()
            self.ports.append(port)
            self.procs.append(
                subprocess.Popen(
                    [
                        "redis-server",
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        f"nodes-{index}.conf",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ],
                    cwd=node_dir,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for port in self.ports:
            wait_for(lambda port=port: self._cli(port, "PING") == "PONG", timeout=30, message=f"node {port}")
        created = subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{port}" for port in self.ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout!r} {created.stderr!r}")
        wait_for(self.ready, timeout=60, message="the cluster to report cluster_state:ok on every node")

    def _cli(self, port: int, *command: str) -> str:
        result = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *command],
            capture_output=True,
            timeout=10,
            check=False,
        )
        return result.stdout.decode(errors="replace").strip()

    def ready(self) -> bool:
        return all("cluster_state:ok" in self._cli(port, "CLUSTER", "INFO") for port in self.ports)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.procs = []
        shutil.rmtree(self.directory, ignore_errors=True)


class ClusterConnectionFactory(ConnectionFactory):
    """``OPTIONS["CONNECTION_FACTORY"]`` for a django-redis cache on Redis Cluster.

    One ``RedisCluster`` client per URL (it discovers the other nodes from the first).
    """

    _clusters: dict[str, Any] = {}

    def connect(self, url: str) -> Any:
        from redis.cluster import RedisCluster as Client

        if url not in self._clusters:
            params = self.make_connection_params(url)
            timeouts = {
                key: params[key] for key in ("socket_timeout", "socket_connect_timeout") if key in params
            }
            self._clusters[url] = Client.from_url(url, **timeouts)
        return self._clusters[url]

    def disconnect(self, connection: Any) -> None:
        connection.close()
        for url, client in list(self._clusters.items()):
            if client is connection:
                del self._clusters[url]
