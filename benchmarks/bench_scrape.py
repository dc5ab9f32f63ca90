"""Scrape cost of the queue gauges, with an empty history and with 1,000,000 finished jobs.

    python benchmarks/bench_scrape.py [--database-url postgres://postgres@127.0.0.1:5432/jobguard_bench_scrape]

It creates the database if needed, migrates it, empties the jobguard tables, and lays the
same live work in both scenarios (due, scheduled and running jobs in three queues, dead
letters). Then, once with no finished jobs and once after one ``INSERT ... SELECT
generate_series`` of finished jobs, it times:

- ``collector``: the queue collector alone (``stats.queue_stats()``, what ``/metrics`` adds);
- ``/metrics``: django-prometheus's whole view, which also renders every other metric;
- ``status``: ``stats.queue_stats(recent=True)``, what ``jobguard_status`` reads.

Each figure is the median of ``--runs`` runs (default 3), each run the median of
``--scrapes`` scrapes; min and max of the runs are printed beside it. It prints a table
and writes JSON under ``benchmarks/results/``. Only PostgreSQL: the point is its planner
and its indexes under a large table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/jobguard_bench_scrape"

FINISHED_SQL = """
INSERT INTO jobguard_job (task_name, queue_name, args, kwargs, priority, status, run_after, attempts,
    max_attempts, visibility_timeout, worker_id, enqueued_at, started_at, finished_at, last_error,
    reappearances, lock_contentions, lock_key, handler_version, result, checkpoints)
SELECT 'shop.tasks.charge_order', (ARRAY['default', 'payments', 'emails'])[1 + g %% 3], '[]', '{}', 0,
    CASE WHEN g %% 50 = 0 THEN 'dead' ELSE 'succeeded' END,
    now() - interval '30 days' + g * interval '2 seconds', 1, 5, 60, 'bench',
    now() - interval '30 days' + g * interval '2 seconds',
    now() - interval '30 days' + g * interval '2 seconds',
    now() - interval '30 days' + g * interval '2 seconds' + interval '50 ms',
    '', 0, 0, '', '', 'null', '{}'
FROM generate_series(1, %s) AS g
"""

LIVE_SQL = [
    # Due jobs, the oldest ten minutes old.
    """INSERT INTO jobguard_job (task_name, queue_name, args, kwargs, priority, status, run_after, attempts,
        max_attempts, visibility_timeout, worker_id, last_error, reappearances, lock_contentions, lock_key,
        handler_version, checkpoints)
    SELECT 'shop.tasks.charge_order', (ARRAY['default', 'payments', 'emails'])[1 + g %% 3], '[]', '{}', 0,
        'queued', now() - interval '10 minutes' + g * interval '500 ms', 0, 5, 60, '', '', 0, 0, '', '', '{}'
    FROM generate_series(1, 1000) AS g""",
    # Scheduled: retries and delayed jobs.
    """INSERT INTO jobguard_job (task_name, queue_name, args, kwargs, priority, status, run_after, attempts,
        max_attempts, visibility_timeout, worker_id, last_error, reappearances, lock_contentions, lock_key,
        handler_version, checkpoints)
    SELECT 'shop.tasks.send_receipt', (ARRAY['default', 'payments', 'emails'])[1 + g %% 3], '[]', '{}', 0,
        'queued', now() + g * interval '1 second', 1, 5, 60, '', '', 0, 0, '', '', '{}'
    FROM generate_series(1, 200) AS g""",
    # Running.
    """INSERT INTO jobguard_job (task_name, queue_name, args, kwargs, priority, status, run_after, attempts,
        max_attempts, visibility_timeout, worker_id, lease_token, lease_expires_at, started_at, last_error,
        reappearances, lock_contentions, lock_key, handler_version, checkpoints)
    SELECT 'shop.tasks.charge_order', (ARRAY['default', 'payments', 'emails'])[1 + g %% 3], '[]', '{}', 0,
        'running', now(), 1, 5, 60, 'bench', md5(g::text), now() + interval '1 hour', now(), '', 0, 0, '', '',
        '{}'
    FROM generate_series(1, 20) AS g""",
    # Dead letters in every replay state.
    """INSERT INTO jobguard_deadletter (task_name, queue_name, args, kwargs, attempts, max_attempts, reason,
        category, error_class, error_message, traceback, first_failed_at, last_failed_at, handler_version,
        worker_id, lock_key, created_at, replay_state, replay_reason)
    SELECT 'shop.tasks.charge_order', (ARRAY['default', 'payments', 'emails'])[1 + g %% 3], '[]', '{}', 5, 5,
        'retries_exhausted', 'transient', 'ProviderTimeout', 'timed out', '', now(), now(), '', 'bench', '',
        now(), (ARRAY['none', 'requested', 'approved', 'rejected', 'replayed'])[1 + g %% 5], ''
    FROM generate_series(1, 50) AS g""",
]


def setup_django(url: str) -> None:
    os.environ["JOBGUARD_TEST_DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def ensure_database(url: str) -> None:
    """Create the URL's database if missing (for this and the console benchmarks that import it)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks._database import create_if_missing

    create_if_missing(url)


def execute(sql: str, params: list[Any] | None = None) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])


def vacuum() -> None:
    from django.db import connection

    # VACUUM sets the visibility map the index-only scans rely on; ANALYZE the statistics.
    connection.ensure_connection()
    autocommit = connection.get_autocommit()
    connection.set_autocommit(True)
    try:
        execute("VACUUM ANALYZE jobguard_job")
        execute("VACUUM ANALYZE jobguard_deadletter")
    finally:
        connection.set_autocommit(autocommit)


def prepare(finished: int) -> None:
    execute(
        "TRUNCATE jobguard_replayevent, jobguard_deadletter, jobguard_idempotencykey, jobguard_job CASCADE"
    )
    for sql in LIVE_SQL:
        execute(sql)
    if finished:
        execute(FINISHED_SQL, [finished])
    vacuum()


def timed(function: Any, scrapes: int) -> float:
    """Median seconds of one call over ``scrapes`` calls (after one warm-up call)."""
    function()
    samples = []
    for _ in range(scrapes):
        began = time.perf_counter()
        function()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def scans(node: dict[str, Any]) -> list[str]:
    """The scan nodes of a JSON plan: node type and index (or table) name."""
    found = []
    if "Relation Name" in node:
        found.append(f"{node['Node Type']} {node.get('Index Name', node['Relation Name'])}")
    for child in node.get("Plans", []):
        found += scans(child)
    return found


def plans() -> list[dict[str, Any]]:
    """Each collector query with the indexes and scan types PostgreSQL picks for it."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_jobguard.monitoring.stats import queue_stats

    with CaptureQueriesContext(connection) as ctx:
        queue_stats(recent=True)
    found = []
    for query in ctx.captured_queries:
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (FORMAT JSON) " + query["sql"])
            plan = cursor.fetchone()[0]
        nodes = scans((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
        found.append({"sql": query["sql"][:120] + "...", "scans": nodes})
    return found


def measure(finished: int, runs: int, scrapes: int) -> dict[str, Any]:
    from django.db import connection
    from django.test import RequestFactory
    from django.test.utils import CaptureQueriesContext
    from django_prometheus.exports import ExportToDjangoView

    from django_jobguard.monitoring.stats import queue_stats

    prepare(finished)
    request = RequestFactory().get("/metrics")
    with CaptureQueriesContext(connection) as ctx:
        response = ExportToDjangoView(request)
    assert response.status_code == 200
    assert b'jobguard_queue_depth{queue="default"}' in response.content
    figures: dict[str, list[float]] = {"collector": [], "metrics_view": [], "status": []}
    for _ in range(runs):
        figures["collector"].append(timed(queue_stats, scrapes))
        figures["metrics_view"].append(timed(lambda: ExportToDjangoView(request), scrapes))
        figures["status"].append(timed(lambda: queue_stats(recent=True), scrapes))
    rows = {"finished": 0, "live": 0}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE status IN ('succeeded', 'dead', 'cancelled')), "
            "count(*) FILTER (WHERE status IN ('queued', 'running')) FROM jobguard_job"
        )
        rows["finished"], rows["live"] = cursor.fetchone()
    return {
        "finished_rows": rows["finished"],
        "live_rows": rows["live"],
        "queries_per_scrape": len(ctx.captured_queries),
        "seconds": {
            name: {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
                "runs": values,
            }
            for name, values in figures.items()
        },
        "plans": plans(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("JOBGUARD_BENCH_DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--rows", type=int, default=1_000_000, help="finished jobs in the large scenario")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (the median is reported)")
    parser.add_argument("--scrapes", type=int, default=20, help="scrapes per run (the run's median is kept)")
    parser.add_argument(
        "--output", type=Path, default=None, help="JSON file (default benchmarks/results/...)"
    )
    args = parser.parse_args()

    ensure_database(args.database_url)
    setup_django(args.database_url)
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    scenarios = {"empty history": measure(0, args.runs, args.scrapes)}
    scenarios[f"{args.rows:,} finished"] = measure(args.rows, args.runs, args.scrapes)

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]
    header = f"{'scenario':<22} {'rows':>10} {'queries':>7}  " + "  ".join(
        f"{name + ' ms':>24}" for name in ("collector", "metrics_view", "status")
    )
    print(header)
    print("-" * len(header))
    for name, result in scenarios.items():
        cells = []
        for figure in ("collector", "metrics_view", "status"):
            s = result["seconds"][figure]
            cells.append(f"{s['median'] * 1000:8.2f} [{s['min'] * 1000:.2f}-{s['max'] * 1000:.2f}]".rjust(24))
        print(
            f"{name:<22} {result['finished_rows'] + result['live_rows']:>10,} "
            f"{result['queries_per_scrape']:>7}  " + "  ".join(cells)
        )
    large, small = scenarios[f"{args.rows:,} finished"], scenarios["empty history"]
    ratio = large["seconds"]["collector"]["median"] / small["seconds"]["collector"]["median"]
    print(f"\ncollector cost with {args.rows:,} finished jobs / empty history: {ratio:.2f}x")
    print(f"query plans with {args.rows:,} finished jobs:")
    for plan in large["plans"]:
        print(f"  {', '.join(plan['scans'])}")

    document = {
        "benchmark": "scrape",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "postgresql": server,
        "runs": args.runs,
        "scrapes_per_run": args.scrapes,
        "ratio_large_to_empty": ratio,
        "scenarios": scenarios,
    }
    output = args.output or RESULTS / "scrape.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nwrote {output.relative_to(ROOT) if output.is_relative_to(ROOT) else output}")


if __name__ == "__main__":
    main()
