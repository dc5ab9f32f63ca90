"""The admin's search box and its filters at a million jobs.

    python benchmarks/bench_admin_search.py [--database-url postgres://postgres@127.0.0.1:5432/jobguard_bench_search]

It creates the database if needed, migrates it, and lays ``--rows`` finished jobs (default
1,000,000; a third with an idempotency key, half with a lock key, twenty task names) and a
tenth as many dead letters, with one ``INSERT ... SELECT generate_series`` each. Then it
requests the jobs', dead letters' and idempotency keys' lists as a superuser, through
Django's test client (the whole admin view: search, ordering, pagination, rendering), for a
search by id, by lock key, by idempotency key, by task name, by error class, for a term that
matches nothing, and for the task filter in the sidebar.

``--contains`` times the same requests with the search fields the console had before
(Django's default ``icontains`` over the text and JSON columns), for comparison.

Each figure is the median of ``--runs`` runs, each run the median of ``--requests``
requests; min and max of the runs are printed beside it, with the scans PostgreSQL's plan
uses for the list's query. Only PostgreSQL: the point is its planner and its indexes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

# The database set-up of the scrape benchmark (this script runs from benchmarks/, as it does).
from bench_scrape import ensure_database, execute, setup_django

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/jobguard_bench_search"

JOBS_SQL = """
INSERT INTO jobguard_job (task_name, queue_name, args, kwargs, priority, status, run_after, attempts,
    max_attempts, visibility_timeout, worker_id, enqueued_at, started_at, finished_at, last_error,
    reappearances, lock_contentions, lock_key, idempotency_key, handler_version, result, checkpoints)
SELECT 'shop.tasks.task_' || (g %% 20), 'default', jsonb_build_array(g), jsonb_build_object('order_id', g), 0,
    CASE WHEN g %% 50 = 0 THEN 'dead' ELSE 'succeeded' END,
    now() - interval '30 days' + g * interval '2 seconds', 1, 5, 60, 'bench',
    now() - interval '30 days' + g * interval '2 seconds',
    now() - interval '30 days' + g * interval '2 seconds',
    now() - interval '30 days' + g * interval '2 seconds' + interval '50 ms',
    CASE WHEN g %% 50 = 0 THEN 'ProviderTimeout: order ' || g ELSE '' END, 0, 0,
    CASE WHEN g %% 2 = 0 THEN 'lock:order:' || g ELSE '' END,
    CASE WHEN g %% 3 = 0 THEN 'charge:order:' || g END, '', 'null', '{}'
FROM generate_series(1, %s) AS g
"""

DEAD_LETTERS_SQL = """
INSERT INTO jobguard_deadletter (task_name, queue_name, args, kwargs, attempts, max_attempts, reason,
    category, error_class, error_message, traceback, first_failed_at, last_failed_at, handler_version,
    worker_id, lock_key, idempotency_key, created_at, replay_state, replay_reason)
SELECT 'shop.tasks.task_' || (g %% 20), 'default', jsonb_build_array(g), jsonb_build_object('order_id', g),
    5, 5, 'retries_exhausted', 'transient', 'ProviderTimeout' || (g %% 7), 'timed out on order ' || g,
    'Traceback (most recent call last): ...', now(), now(), '', 'bench',
    CASE WHEN g %% 2 = 0 THEN 'lock:order:' || g ELSE '' END,
    CASE WHEN g %% 3 = 0 THEN 'charge:order:' || g END,
    now() - interval '30 days' + g * interval '20 seconds', 'none', ''
FROM generate_series(1, %s) AS g
"""

KEYS_SQL = """
INSERT INTO jobguard_idempotencykey (key, scope, fingerprint, status, result, duplicates, created_at,
    updated_at, expires_at)
SELECT 'charge:order:' || g, 'shop.tasks.task_' || (g %% 20), md5(g::text), 'succeeded', 'null', 0,
    now(), now(), now() + interval '1 day'
FROM generate_series(1, %s) AS g
"""

# The console's search fields before it matched whole values over indexed columns.
CONTAINS = {
    "job": (["=id", "task_name", "lock_key"], ["idempotency_key", "args", "kwargs"]),
    "deadletter": (
        ["=id", "task_name", "error_class", "lock_key"],
        ["error_message", "idempotency_key", "args", "kwargs", "traceback"],
    ),
    "idempotencykey": ([], ["key"]),
}


def prepare(rows: int) -> None:
    from django.db import connection

    execute(
        "TRUNCATE jobguard_replayevent, jobguard_deadletter, jobguard_idempotencykey, jobguard_job CASCADE"
    )
    execute(JOBS_SQL, [rows])
    execute(DEAD_LETTERS_SQL, [rows // 10])
    execute(KEYS_SQL, [rows // 3])
    connection.set_autocommit(True)
    for table in ("jobguard_job", "jobguard_deadletter", "jobguard_idempotencykey"):
        execute(f"VACUUM ANALYZE {table}")


def scans(node: dict[str, Any]) -> list[str]:
    found = []
    if "Relation Name" in node or "Index Name" in node:
        found.append(f"{node['Node Type']} {node.get('Index Name', node.get('Relation Name'))}")
    for child in node.get("Plans", []):
        found += scans(child)
    return found


def list_scans(queries: list[dict[str, Any]], table: str) -> str:
    """The scans of the list query (the page's rows, not its counts or its filters' choices)."""
    from django.db import connection

    for query in queries:
        sql = query["sql"]
        if sql.startswith(f'SELECT "{table}"."id"') and f'FROM "{table}"' in sql:
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
                plan = cursor.fetchone()[0]
            nodes = scans((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
            return ", ".join(dict.fromkeys(nodes))
    return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("JOBGUARD_BENCH_DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--rows", type=int, default=1_000_000, help="finished jobs")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (the median is reported)")
    parser.add_argument("--requests", type=int, default=5, help="requests per run (the run's median is kept)")
    parser.add_argument("--contains", action="store_true", help="the former icontains search fields")
    parser.add_argument("--reuse", action="store_true", help="keep the rows of an earlier run")
    args = parser.parse_args()

    ensure_database(args.database_url)
    setup_django(args.database_url)
    from django.contrib import admin
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from django_jobguard.models import DeadLetter, IdempotencyKey, Job

    setup_test_environment()  # the test client's host, and response.context
    call_command("migrate", verbosity=0)
    if not args.reuse or not Job.objects.exists():
        prepare(args.rows)
    if args.contains:
        for model in (Job, DeadLetter, IdempotencyKey):
            model_admin = admin.site.get_model_admin(model)
            plain, payload = CONTAINS[model._meta.model_name]
            model_admin.search_fields = plain or ["=id"]
            model_admin.payload_search_fields = payload
            model_admin.get_search_results = admin.ModelAdmin.get_search_results.__get__(model_admin)

    user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    job_id = Job.objects.order_by("id").values_list("id", flat=True)[args.rows // 2]
    middle = args.rows // 2 // 6 * 6  # even and a multiple of 3: it has a lock key and an idempotency key
    cases = [
        ("jobs", "job", {"q": str(job_id)}, "id"),
        ("jobs", "job", {"q": f"lock:order:{middle}"}, "lock key"),
        ("jobs", "job", {"q": f"charge:order:{middle}"}, "idempotency key"),
        ("jobs", "job", {"q": "shop.tasks.task_7"}, "task name"),
        ("jobs", "job", {"q": "no-such-thing"}, "no match"),
        ("jobs", "job", {"task_name": "shop.tasks.task_7"}, "task filter"),
        ("dead letters", "deadletter", {"q": "ProviderTimeout3"}, "error class"),
        ("dead letters", "deadletter", {"q": f"lock:order:{args.rows // 20 // 2 * 2}"}, "lock key"),
        ("dead letters", "deadletter", {"q": "no-such-thing"}, "no match"),
        ("idempotency keys", "idempotencykey", {"q": f"charge:order:{args.rows // 6 // 3 * 3}"}, "key"),
        ("idempotency keys", "idempotencykey", {"q": "no-such-thing"}, "no match"),
    ]
    print(f"{args.rows:,} jobs, {args.rows // 10:,} dead letters, {args.rows // 3:,} keys;")
    print("search fields: " + ("the former icontains" if args.contains else "the console's") + "\n")
    header = f"{'list':<17} {'request':<16} {'ms (median [min-max])':>26}  {'rows':>5}  plan"
    print(header)
    print("-" * (len(header) + 40))
    for title, model_name, params, label in cases:
        url = f"/admin/jobguard/{model_name}/"
        medians = []
        for _ in range(args.runs):
            samples = []
            for _ in range(args.requests):
                began = time.perf_counter()
                response = client.get(url, params)
                samples.append(time.perf_counter() - began)
                assert response.status_code == 200, (url, params, response.status_code)
            medians.append(statistics.median(samples))
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(url, params)
        shown = len(response.context["cl"].result_list)
        table = f"jobguard_{model_name}"
        ms = statistics.median(medians) * 1000
        cell = f"{ms:8.1f} [{min(medians) * 1000:.1f}-{max(medians) * 1000:.1f}]"
        print(f"{title:<17} {label:<16} {cell:>26}  {shown:>5}  {list_scans(ctx.captured_queries, table)}")


if __name__ == "__main__":
    main()
