"""Cost of idempotency keys: enqueue with and without a key, duplicates, and pruning.

Usage (PostgreSQL; the database is created and migrated if needed)::

    JOBGUARD_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/jg_bench_idem \\
        python benchmarks/bench_idempotency.py --jobs 2000 --keys 20000 --repeat 3

Without the URL it runs on the SQLite file of tests/settings.py. Prints medians.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


def timed(function, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        reset()
        started = time.perf_counter()
        function()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def reset() -> None:
    from django_jobguard.models import IdempotencyKey, Job

    IdempotencyKey.objects.all().delete()
    Job.objects.all().delete()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()

    url = os.environ.get("JOBGUARD_TEST_DATABASE_URL")
    if url:
        from benchmarks._database import create_if_missing

        create_if_missing(url)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.utils import timezone

    from django_jobguard.maintenance import retention
    from django_jobguard.models import IdempotencyKey
    from tests.testapp import tasks

    call_command("migrate", verbosity=0)
    n = options.jobs

    def plain() -> None:
        for i in range(n):
            tasks.add.enqueue(i)

    def keyed() -> None:
        for i in range(n):
            tasks.add.using(idempotency_key=f"k:{i}").enqueue(i)

    def duplicates() -> None:
        tasks.add.using(idempotency_key="same").enqueue(1)
        for _ in range(n - 1):
            tasks.add.using(idempotency_key="same").enqueue(1)

    cases = (("no key", plain), ("new key each", keyed), ("same key (duplicates)", duplicates))
    for where in ("autocommit", "one transaction"):
        print(f"{connection.vendor}, {n} enqueues {where}, median of {options.repeat} runs")
        for label, function in cases:
            if where == "one transaction":
                function = transaction.atomic()(function)
            seconds = timed(function, options.repeat)
            print(f"  {label:24s} {n / seconds:8.0f} enqueues/s  ({seconds * 1000 / n:.3f} ms each)")

    def prune() -> None:
        past = timezone.now() - datetime.timedelta(days=1)
        IdempotencyKey.objects.bulk_create(
            IdempotencyKey(key=f"p:{i}", scope="bench", fingerprint="0" * 64, expires_at=past)
            for i in range(options.keys)
        )
        started = time.perf_counter()
        deleted = retention.prune_expired_keys()
        prune.seconds = time.perf_counter() - started  # type: ignore[attr-defined]
        assert deleted == options.keys, deleted

    runs = []
    for _ in range(options.repeat):
        reset()
        prune()
        runs.append(prune.seconds)  # type: ignore[attr-defined]
    seconds = statistics.median(runs)
    print(f"  prune {options.keys} expired keys      {options.keys / seconds:8.0f} keys/s  ({seconds:.2f} s)")
    reset()


if __name__ == "__main__":
    main()
