"""Helpers shared by the drivers, importable from both virtualenvs (standard library only).

A driver runs inside the virtualenv of the system it drives (the project's for
django-jobguard, ``benchmarks/.venv-peers`` for the peers) and talks to the
orchestrator (``bench_peers.py``) through command-line arguments and one JSON file.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

#: Jobs whose index is at or above this are warm-up jobs, left out of every figure.
WARMUP_INDEX = 1_000_000_000


def django_database(url: str) -> dict[str, Any]:
    """A Django ``DATABASES`` entry for a ``postgres://`` or ``mysql://user@host:port/name`` URL."""
    parsed = urlparse(url)
    if parsed.scheme in ("postgres", "postgresql"):
        engine, options = "django.db.backends.postgresql", {}
    elif parsed.scheme in ("mysql", "mariadb"):
        # What django-jobguard's checks ask of MariaDB/MySQL (docs/how-to/choose-a-database.md).
        engine = "django.db.backends.mysql"
        options = {
            "charset": "utf8mb4",
            "isolation_level": "read committed",
            "init_command": "SET time_zone = '+00:00'",
        }
    else:
        raise ValueError(f"not a postgres:// or mysql:// URL: {url!r}")
    return {
        "ENGINE": engine,
        "NAME": unquote(parsed.path.lstrip("/")),
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": parsed.hostname or "",
        "PORT": str(parsed.port or ""),
        "OPTIONS": options,
    }


def conninfo(url: str) -> str:
    """A libpq connection string for a ``postgres://`` URL (what psycopg and procrastinate take)."""
    db = django_database(url)
    parts = {"dbname": db["NAME"], "user": db["USER"], "host": db["HOST"], "port": db["PORT"]}
    if db["PASSWORD"]:
        parts["password"] = db["PASSWORD"]
    return " ".join(f"{key}={value}" for key, value in parts.items() if value)


def driver_parser(description: str) -> argparse.ArgumentParser:
    """The command line every driver takes: ``enqueue`` or ``worker``."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    enqueue = sub.add_parser("enqueue", help="enqueue jobs with indexes start..start+n-1 and time it")
    enqueue.add_argument("--n", type=int, required=True)
    enqueue.add_argument("--start", type=int, default=0)
    enqueue.add_argument("--mode", choices=["single", "bulk"], default="single")
    enqueue.add_argument("--chunk", type=int, default=1000, help="jobs per bulk call")
    enqueue.add_argument("--rate", type=float, default=0.0, help="jobs per second (0: as fast as possible)")
    enqueue.add_argument("--variant", default="default")
    enqueue.add_argument("--out", required=True)
    enqueue.add_argument("--profile", default="", help="write cProfile stats of the enqueue loop here")
    capture = sub.add_parser("capture", help="enqueue one job and write the SQL it sent (JSON list)")
    capture.add_argument("--variant", default="default")
    capture.add_argument("--out", required=True)
    worker = sub.add_parser("worker", help="run one worker process and report its CPU time")
    worker.add_argument("--variant", default="default")
    worker.add_argument("--index", type=int, default=0)
    worker.add_argument("--concurrency", type=int, default=2, help="0: the worker's own default (no flag)")
    worker.add_argument("--queues", default="", help="comma-separated queues to serve (default: all)")
    worker.add_argument("--pool", default="threads", help="Celery's pool (threads or prefork)")
    worker.add_argument("--max-jobs", type=int, default=0, help="stop after claiming this many (0: no limit)")
    worker.add_argument("--burst", action="store_true", help="exit when nothing is left")
    worker.add_argument("--profile", default="", help="write cProfile stats of every thread here")
    worker.add_argument("--ready", default="", help="create this file once set up, then wait for --go")
    worker.add_argument("--go", default="", help="start working once this file exists")
    worker.add_argument("--out", required=True)
    return parser


def wait_for_go(args: argparse.Namespace, timeout: float = 120) -> None:
    """Say we are set up (imports done), then wait for the orchestrator's go.

    All workers of a run start claiming together, so no worker drains part of the queue
    alone while another is still importing Django.
    """
    if not args.ready:
        return
    Path(args.ready).touch()
    deadline = time.monotonic() + timeout
    while not os.path.exists(args.go):
        if time.monotonic() > deadline:
            raise SystemExit("no go signal from the orchestrator")
        time.sleep(0.002)


def write_json(path: str, data: dict[str, Any]) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def paced(indexes: range, rate: float) -> Iterator[int]:
    """Yield ``indexes``, at ``rate`` per second if it is positive (on a fixed schedule, no drift)."""
    started = time.perf_counter()
    for k, index in enumerate(indexes):
        if rate > 0:
            delay = started + k / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        yield index


def timed_enqueue(n: int, out: str, body: Callable[[], None], profile: str = "") -> None:
    """Run ``body`` (which enqueues ``n`` jobs), write its wall and CPU time to ``out``."""
    # CPU time, not wall time: waiting for the database is not what the profile is after.
    profiler = cProfile.Profile(time.process_time) if profile else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if profiler:
        profiler.runcall(body)
        profiler.dump_stats(profile)
    else:
        body()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    write_json(out, {"n": n, "seconds": wall, "client_cpu_seconds": cpu, "rate": n / wall if wall else 0.0})


def rss_kib(pid: int | None = None) -> int:
    """Resident set size of a process in KiB (VmRSS from /proc; 0 where there is no /proc)."""
    try:
        for line in Path(f"/proc/{pid or os.getpid()}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU of ``root`` and its live descendants (for Celery's prefork pool).

    ``time.process_time`` counts one process; a prefork worker's jobs run in its children.
    """
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        ticks[int(entry.name)] = int(fields[11]) + int(fields[12])
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(ticks.get(pid, 0) for pid in tree) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds between two marks: ``time.process_time`` (every thread of this process),
    or with ``tree=True`` this process and its children (a prefork pool)."""

    def __init__(self, tree: bool = False) -> None:
        self.tree = tree
        self.mark()

    def _cpu(self) -> float:
        return tree_cpu_seconds(os.getpid()) if self.tree else time.process_time()

    def mark(self) -> None:
        self.cpu0 = self._cpu()
        self.wall0 = time.perf_counter()

    def report(self, out: str, **extra: Any) -> None:
        write_json(
            out,
            {
                "pid": os.getpid(),
                "cpu_seconds": self._cpu() - self.cpu0,
                "wall_seconds": time.perf_counter() - self.wall0,
                "rss_kib": rss_kib(),
                **extra,
            },
        )


class ThreadProfiler:
    """cProfile for every thread of the process (cProfile alone sees only the thread that enables it).

    Threads started after :meth:`install` run under their own profiler; :meth:`dump` merges
    them with the main thread's into one stats file. The clock is each thread's own CPU
    time, so time spent waiting (for the database, a lock, a queue) does not count.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()
        self.main = cProfile.Profile(time.thread_time)

    def install(self) -> None:
        original = threading.Thread.run
        profiler = self

        def run(thread: threading.Thread) -> None:
            profile = cProfile.Profile(time.thread_time)
            with profiler._lock:
                profiler.profiles.append(profile)
            profile.enable()
            try:
                original(thread)
            finally:
                profile.disable()

        threading.Thread.run = run  # type: ignore[method-assign]
        self.main.enable()

    def dump(self) -> None:
        self.main.disable()
        stats = pstats.Stats(self.main)
        with self._lock:
            for profile in self.profiles:
                try:
                    stats.add(profile)
                except TypeError:
                    continue  # a thread that never ran anything has no stats
        stats.dump_stats(self.path)
