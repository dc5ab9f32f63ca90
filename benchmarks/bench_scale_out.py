#!/usr/bin/env python
"""Workers through PgBouncer (transaction mode) against direct, and LISTEN against polling.

    python benchmarks/bench_scale_out.py [--database-url postgres://postgres@127.0.0.1:5432/jobguard_h10]
                                   [--jobs 3000] [--runs 3] [--workers 2,4,8] [--markdown FILE]

The undeclared column runs the same workers with Django's pooling settings but without
``JOBGUARD["POOLED_DATABASES"]``: each process finds the pooler at its first lost prepared
statement and sends text from then on.

Uses the test suite's settings and tasks (tests/settings.py, tests/testapp) on the given
database (migrated here; its job tables are emptied between runs) and a private pgbouncer
(tests/support/pgbouncer.py, pool of 10 server connections). Prints two tables:

1. processing rate: ``--jobs`` no-op jobs drained by N ``jobguard_worker --burst
   --concurrency 2`` processes, jobs per second from the first claim to the last ack
   (database clock), median of ``--runs`` with min and max;
2. enqueue-to-start latency: one idle worker (``--poll-interval 1``, the default) through
   PgBouncer (``--reaper-interval 2``, also the default), 40 jobs enqueued 0.25 s apart; p50 and p90 of
   ``started_at - enqueued_at`` (database clock), with the LISTEN alias and without it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/jobguard_h10")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", default="2,4,8")
    parser.add_argument("--latency-jobs", type=int, default=40)
    parser.add_argument("--markdown", type=Path, default=None, help="Also write the tables here.")
    options = parser.parse_args()

    url = urlparse(options.database_url)
    os.environ["JOBGUARD_TEST_DATABASE_URL"] = options.database_url
    os.environ["JOBGUARD_TEST_DB_NAME"] = url.path.lstrip("/")
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from tests.support.pgbouncer import PgBouncer
    from tests.testapp import tasks

    call_command("migrate", verbosity=0)
    bouncer = PgBouncer(server_host=url.hostname or "127.0.0.1", server_port=url.port or 5432, pool_size=10)
    bouncer.start()

    def reset() -> None:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE jobguard_job, jobguard_idempotencykey, jobguard_deadletter CASCADE")

    def env(pooled: bool, listen: bool = True, declared: bool = True) -> dict[str, str]:
        extra = dict(os.environ)
        if pooled:
            extra["JOBGUARD_TEST_PGBOUNCER_PORT"] = str(bouncer.port)
            extra["JOBGUARD_TEST_LISTEN_DIRECT"] = "1" if listen else "0"
            extra["JOBGUARD_TEST_PGBOUNCER_UNDECLARED"] = "0" if declared else "1"
        return extra

    def worker(*args: str, environment: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "jobguard_worker", *args],
            cwd=ROOT,
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def rate(processes: int, pooled: bool, declared: bool = True) -> float:
        reset()
        tasks.noop.bulk_enqueue([((), {})] * options.jobs)
        procs = [
            worker("--burst", "--concurrency", "2", environment=env(pooled, declared=declared))
            for _ in range(processes)
        ]
        for proc in procs:
            proc.wait(timeout=1800)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*), EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) "
                "FROM jobguard_job WHERE status = 'succeeded'"
            )
            done, seconds = cursor.fetchone()
        if done != options.jobs:
            raise SystemExit(f"{done} of {options.jobs} jobs succeeded")
        return done / float(seconds)

    def latency(listen: bool) -> list[float]:
        reset()
        proc = worker("--poll-interval", "1", "--reaper-interval", "2", environment=env(True, listen))
        try:
            time.sleep(5)  # started and idle
            for _ in range(options.latency_jobs):
                tasks.noop.enqueue()
                time.sleep(0.25)
            deadline = time.monotonic() + 120
            with connection.cursor() as cursor:
                while time.monotonic() < deadline:
                    cursor.execute("SELECT count(*) FROM jobguard_job WHERE status = 'succeeded'")
                    if cursor.fetchone()[0] == options.latency_jobs:
                        break
                    time.sleep(0.2)
                cursor.execute("SELECT EXTRACT(EPOCH FROM started_at - enqueued_at) * 1000 FROM jobguard_job")
                return sorted(float(row[0]) for row in cursor.fetchall())
        finally:
            proc.terminate()
            proc.wait(timeout=60)

    lines = [
        f"Processing rate ({options.jobs} no-op jobs, `--concurrency 2` per process, "
        f"median of {options.runs} [min-max], jobs/s):",
        "",
        "| worker processes | through PgBouncer | through PgBouncer, undeclared | undeclared / declared "
        "| direct |",
        "| --- | --- | --- | --- | --- |",
    ]
    try:
        for processes in [int(n) for n in options.workers.split(",")]:
            cells = []
            medians = []
            # Declared, undeclared (the pooler found at run time) and direct, interleaved per run.
            setups = ((True, True), (True, False), (False, True))
            runs: dict[tuple[bool, bool], list[float]] = {setup: [] for setup in setups}
            for _ in range(options.runs):
                for pooled, declared in setups:
                    runs[(pooled, declared)].append(rate(processes, pooled, declared))
            for setup in setups:
                values = runs[setup]
                medians.append(statistics.median(values))
                cells.append(f"{medians[-1]:,.0f} [{min(values):,.0f}-{max(values):,.0f}]")
            ratio = f"{medians[1] / medians[0]:.2f}x"
            lines.append(f"| {processes} | {cells[0]} | {cells[1]} | {ratio} | {cells[2]} |")
            print(lines[-1], flush=True)
        lines += [
            "",
            f"Enqueue-to-start through PgBouncer, one idle worker, `--poll-interval 1 --reaper-interval 2`, "
            f"{options.latency_jobs} jobs (ms):",
            "",
            "| wake-ups | p50 | p90 |",
            "| --- | --- | --- |",
        ]
        for listen in (True, False):
            values = latency(listen)
            p50 = statistics.median(values)
            p90 = values[int(0.9 * (len(values) - 1))]
            label = "LISTEN through the direct alias" if listen else "polling (no LISTEN alias)"
            lines.append(f"| {label} | {p50:.0f} | {p90:.0f} |")
            print(lines[-1], flush=True)
    finally:
        reset()
        bouncer.stop()
    print("\n".join(lines))
    if options.markdown:
        options.markdown.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
