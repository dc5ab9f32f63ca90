"""Uncontended lock acquire + release pairs per second, per back end.

Compares django-jobguard's database back end (SQLite and PostgreSQL) and Redis back end
with redis-py's own ``Lock`` on the same Redis. One thread, one key, a new lock object
per pair (as ``with lock(key):`` does); each run counts the pairs completed in
``--seconds``; the table shows the median of ``--runs`` runs with their min and max.

    python benchmarks/bench_locks.py \\
        --pg-url postgres://postgres@127.0.0.1:5432/jg_locks_bench \\
        --redis-url redis://127.0.0.1:6379/1

The PostgreSQL database is created (and migrated) if missing; the SQLite file lives in a
temporary directory. A store that cannot be reached is reported as skipped. Results are
printed and written to ``benchmarks/results/locks-<UTC time>.json`` and ``locks-latest.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))

KEY = "bench:account:1"
WARMUP_PAIRS = 200


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("JOBGUARD_BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/jg_locks_bench"),
        help="PostgreSQL database for the database back end (created if missing); '' to skip",
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("JOBGUARD_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
        help="Redis for the Redis back end and redis-py's Lock; '' to skip",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per back end (the median is reported)")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one run, in seconds")
    parser.add_argument("--no-save", action="store_true", help="print only; write no JSON")
    return parser.parse_args()


def configure(args: argparse.Namespace, sqlite_path: Path) -> None:
    import django
    from django.conf import settings

    databases: dict[str, dict[str, Any]] = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(sqlite_path),
            # As recommended for workers (check jobguard.W001), and as the test suite runs.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
    if args.pg_url:
        url = urlparse(args.pg_url)
        databases["postgres"] = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(url.path.lstrip("/")),
            "USER": unquote(url.username or ""),
            "PASSWORD": unquote(url.password or ""),
            "HOST": url.hostname or "",
            "PORT": str(url.port or ""),
        }
    caches: dict[str, dict[str, Any]] = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    }
    if args.redis_url:
        caches["redis"] = {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": args.redis_url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
        }
    settings.configure(
        DATABASES=databases,
        CACHES=caches,
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "django_jobguard"],
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        JOBGUARD={"LOCKS": {"CACHE_ALIAS": "redis"}},
    )
    django.setup()


def measure(pair: Callable[[], None], runs: int, seconds: float) -> list[float]:
    """Pairs per second of ``runs`` runs of ``seconds`` each, after a warm-up."""
    for _ in range(WARMUP_PAIRS):
        pair()
    rates = []
    for _ in range(runs):
        count = 0
        started = time.perf_counter()
        deadline = started + seconds
        while True:
            for _ in range(50):
                pair()
            count += 50
            now = time.perf_counter()
            if now >= deadline:
                break
        rates.append(count / (now - started))
    return rates


def jobguard_pair(backend: str, **options: Any) -> Callable[[], None]:
    from django_jobguard import lock

    def pair() -> None:
        held = lock(KEY, ttl=30, backend=backend, **options)
        if not held.acquire(blocking=False):
            raise RuntimeError(f"{held.name} is held: the benchmark needs it uncontended")
        held.release()

    return pair


def redis_py_pair() -> Callable[[], None]:
    from django_redis import get_redis_connection

    client = get_redis_connection("redis")

    def pair() -> None:
        held = client.lock(f"bench:redis-py:{KEY}", timeout=30)
        if not held.acquire(blocking=False):
            raise RuntimeError("redis-py's lock is held: the benchmark needs it uncontended")
        held.release()

    return pair


def server_versions(args: argparse.Namespace) -> dict[str, str]:
    import django
    from django.db import connections

    versions = {
        "python": platform.python_version(),
        "django": django.get_version(),
        "sqlite": __import__("sqlite3").sqlite_version,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
    }
    if "postgres" in connections.settings:
        try:
            with connections["postgres"].cursor() as cursor:
                cursor.execute("SHOW server_version")
                versions["postgresql"] = cursor.fetchone()[0]
        except Exception as exc:  # a version is only a label
            versions["postgresql"] = f"unreachable ({exc})"
    if args.redis_url:
        try:
            import redis
            from django_redis import get_redis_connection

            versions["redis"] = get_redis_connection("redis").info("server")["redis_version"]
            versions["redis-py"] = redis.__version__
        except Exception as exc:
            versions["redis"] = f"unreachable ({exc})"
    return versions


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.pg_url:
            try:
                from benchmarks._database import create_if_missing

                create_if_missing(args.pg_url)
            except Exception as exc:  # reported; the other rows still run
                print(f"PostgreSQL skipped: {exc}", file=sys.stderr)
                args.pg_url = ""
        configure(args, Path(tmp) / "bench.sqlite3")
        from django.core.management import call_command

        call_command("migrate", database="default", verbosity=0)
        if args.pg_url:
            call_command("migrate", database="postgres", verbosity=0)

        cases: list[tuple[str, str, Callable[[], Callable[[], None]]]] = [
            ("jobguard database", "SQLite", lambda: jobguard_pair("database", using="default")),
        ]
        if args.pg_url:
            cases.append(
                ("jobguard database", "PostgreSQL", lambda: jobguard_pair("database", using="postgres"))
            )
        if args.redis_url:
            cases.append(("jobguard redis", "Redis", lambda: jobguard_pair("redis", cache_alias="redis")))
            cases.append(("redis-py Lock", "Redis", redis_py_pair))

        rows = []
        for name, store, make in cases:
            try:
                rates = measure(make(), args.runs, args.seconds)
            except Exception as exc:  # e.g. Redis not running: skip that row
                print(f"{name} on {store} skipped: {exc}", file=sys.stderr)
                continue
            rows.append(
                {
                    "lock": name,
                    "store": store,
                    "median": statistics.median(rates),
                    "min": min(rates),
                    "max": max(rates),
                    "runs": rates,
                }
            )
        versions = server_versions(args)

    header = f"{'lock':<20} {'store':<11} {'pairs/s median':>15} {'min':>9} {'max':>9}"
    print(f"Uncontended acquire+release pairs per second ({args.runs} runs of {args.seconds:g}s, one thread)")
    print(header)
    print("-" * len(header))
    for row in rows:
        rates = f"{row['median']:>15,.0f} {row['min']:>9,.0f} {row['max']:>9,.0f}"
        print(f"{row['lock']:<20} {row['store']:<11} {rates}")
    print("; ".join(f"{key} {value}" for key, value in versions.items()))

    if not args.no_save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        report = {
            "benchmark": "locks: uncontended acquire+release pairs per second",
            "when": stamp,
            "runs": args.runs,
            "seconds_per_run": args.seconds,
            "versions": versions,
            "results": rows,
        }
        text = json.dumps(report, indent=2) + "\n"
        (RESULTS / f"locks-{stamp}.json").write_text(text)
        (RESULTS / "locks-latest.json").write_text(text)
        print(f"written: {RESULTS.relative_to(ROOT)}/locks-{stamp}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
