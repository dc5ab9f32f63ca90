"""What durable invalidation costs a writer: one write transaction with and without it.

Each transaction updates one row and invalidates one key (local-memory cache, so the cache
itself costs next to nothing and the difference is the job: its INSERT in the transaction
and its DELETE after the commit). Each run times ``--writes`` transactions per variant
(alternating, so drift hits both); the table shows the median of ``--runs`` runs.

    DJANGO_SETTINGS_MODULE=tests.settings python benchmarks/bench_cache_durable.py --runs 7
    JOBGUARD_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/jg_bench \\
        DJANGO_SETTINGS_MODULE=tests.settings python benchmarks/bench_cache_durable.py --runs 7

A throw-away test database is created and destroyed (SQLite file, or ``test_<name>`` on PostgreSQL).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per variant; the median is shown")
    parser.add_argument("--writes", type=int, default=300, help="write transactions per run and variant")
    options = parser.parse_args()

    import django

    django.setup()
    from django.db import connection, transaction
    from django.db.models import F

    from django_jobguard.cache import invalidate
    from tests.testapp.models import Account

    name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        account = Account.objects.create(owner="bench")

        def write(durable: bool) -> None:
            with transaction.atomic():
                Account.objects.filter(pk=account.pk).update(balance=F("balance") + 1)
                invalidate(f"account:{account.pk}:balance", durable=durable)

        results: dict[bool, list[float]] = {False: [], True: []}
        for durable in (False, True):  # warm up both paths
            for _ in range(20):
                write(durable)
        for _ in range(options.runs):
            for durable in (False, True):
                began = time.perf_counter()
                for _ in range(options.writes):
                    write(durable)
                results[durable].append((time.perf_counter() - began) / options.writes * 1e6)
        plain, durable_ = statistics.median(results[False]), statistics.median(results[True])
        print(f"database: {connection.vendor}; {options.runs} runs x {options.writes} write transactions")
        print(f"invalidate()               median {plain:8.1f} us per write transaction")
        print(f"invalidate(durable=True)   median {durable_:8.1f} us per write transaction")
        print(f"cost of durability: +{durable_ - plain:.1f} us ({durable_ / plain:.2f}x)")
    finally:
        connection.creation.destroy_test_db(name, verbosity=0)


if __name__ == "__main__":
    main()
