"""Worker "hosts" as network namespaces, for the partition and clock-skew tests.

Each host is an ``ip netns`` namespace joined to this machine by a veth pair. Addresses come
only from 198.18.0.0/15 (set aside for network tests): host ``i`` is 198.18.<n>.2 inside its
namespace, 198.18.<n>.1 on this machine's end, a /30 with no route anywhere else. PostgreSQL
(and Redis) are not reconfigured: a small relay bound to 198.18.<n>.1 forwards each
connection to the server on 127.0.0.1. Partitioning a host sets its end of the veth down
inside its namespace, which drops its traffic both ways until it is healed.

Needs root (CAP_NET_ADMIN) and iproute2; :func:`unavailable` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

#: Third octet of host 0's /30 in 198.18.0.0/15; the pid spreads concurrent runs apart.
_BASE = 100 + os.getpid() % 100


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *args] if netns is None else ["ip", "netns", "exec", netns, "ip", *args]
    result = subprocess.run(command, capture_output=True, timeout=30, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.decode(errors='replace').strip()}")


def unavailable() -> str:
    """Why namespaces cannot be used here ("" if they can)."""
    if os.geteuid() != 0:
        return "needs root (ip netns, veth pairs)"
    if not shutil.which("ip"):
        return "needs iproute2 (ip)"
    probe = f"jgprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"cannot create a network namespace: {exc}"
    _ip("netns", "del", probe)
    return ""


class Relay:
    """Forwards TCP connections from ``listen`` to ``target``, byte for byte, in threads."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(listen, reuse_port=False)
        self.server.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=f"relay-{listen[0]}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        a.settimeout(None)
        b.settimeout(None)
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([a, b], [], [], 0.5)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (b if sock is a else a).sendall(data)
        except OSError:
            return
        finally:
            a.close()
            b.close()

    def close(self) -> None:
        self._stop.set()
        self.server.close()
        self._thread.join(timeout=5)


class Host:
    """One namespace with its veth pair and relays; processes started in it are its workers."""

    def __init__(self, index: int, log_dir: Path) -> None:
        self.index = index
        self.netns = f"jg{os.getpid()}h{index}"
        self.outer = f"jg{os.getpid() % 100000}o{index}"  # interface names: 15 characters at most
        self.inner = f"jg{os.getpid() % 100000}i{index}"
        octet = _BASE + index
        self.gateway = f"198.18.{octet}.1"
        self.address = f"198.18.{octet}.2"
        self.log_dir = log_dir
        self.relays: list[Relay] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: dict[int, Path] = {}

    def create(self, forward: list[tuple[int, tuple[str, int]]]) -> None:
        _ip("netns", "add", self.netns)
        _ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        _ip("link", "set", self.inner, "netns", self.netns)
        _ip("addr", "add", f"{self.gateway}/30", "dev", self.outer)
        _ip("link", "set", self.outer, "up")
        _ip("addr", "add", f"{self.address}/30", "dev", self.inner, netns=self.netns)
        _ip("link", "set", self.inner, "up", netns=self.netns)
        _ip("link", "set", "lo", "up", netns=self.netns)
        for port, target in forward:
            self.relays.append(Relay((self.gateway, port), target))

    def start(self, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        path = self.log_dir / f"host{self.index}-{len(self.procs)}.log"
        with path.open("wb") as log:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, *command],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        self._logs[proc.pid] = path
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return self._logs[proc.pid].read_text(errors="replace")

    def partition(self) -> None:
        """Drop every packet to and from this host (its end of the link goes down)."""
        _ip("link", "set", self.inner, "down", netns=self.netns)

    def heal(self) -> None:
        _ip("link", "set", self.inner, "up", netns=self.netns)

    def destroy(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for relay in self.relays:
            relay.close()
        # Deleting the namespace removes its end of the pair, and with it the other end.
        with contextlib.suppress(RuntimeError):
            _ip("netns", "del", self.netns)
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", self.outer)


@contextlib.contextmanager
def hosts(count: int, log_dir: Path, forward: list[tuple[int, tuple[str, int]]]) -> Iterator[list[Host]]:
    """``count`` hosts, each forwarding ``forward`` ports to their targets; removed afterwards."""
    made = [Host(index, log_dir) for index in range(count)]
    try:
        for host in made:
            host.create(forward)
        yield made
    finally:
        for host in made:
            host.destroy()
