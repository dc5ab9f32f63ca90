"""Every console page at 100,000 jobs and 10,000 dead letters: is each under a second?

    python benchmarks/bench_console.py [--database-url postgres://postgres@127.0.0.1:5432/jg_bench_console]
                                       [--jobs 100000] [--dead-letters 10000] [--runs 5] [--keep]

It creates the database if needed, migrates it, and fills it with one ``INSERT ... SELECT
generate_series`` per table: ``--jobs`` jobs over 13 queues and 20 tasks in every state the
console names (due, scheduled, waiting for retry, running, stuck, waiting for dependencies,
succeeded, dead, cancelled), enqueued over the last seven days; ``--dead-letters`` dead
letters, one per dead job, in every replay state, a tenth of those requested carrying a
corrected payload, with their replay events and idempotency keys; 1,000 finished three-step
chains and one open batch of 5,000; held and free locks; eight workers (two stale); an open
breaker; schedules; an hour of per-minute queue history; a paused queue. ``--keep`` reuses
the rows of an earlier run (the fill takes a minute or two).

Then it requests each page through Django's test client, logged in as a superuser, and as a
user with every django-jobguard permission but ``jobguard.view_payload`` on the pages that
differ for such a user (search fields, columns, the bulk confirmation). Each page is
requested once to count its queries (and warm the caches), then ``--runs`` times: the table
gives the median and the slowest of those, the query count, the slowest query's time and
whether the page is under the budget (1 s). ``--explain`` prints ``EXPLAIN (ANALYZE,
BUFFERS)`` of the slowest query of each page over the budget. The load average at the start
and the end is printed with the figures: on a busy host they are upper bounds.
Only PostgreSQL (its planner and indexes are the point); the settings are the test suite's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The database set-up of the scrape benchmark (this script runs from benchmarks/, as it does).
from bench_scrape import ensure_database, execute, setup_django

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/jg_bench_console"
BUDGET_SECONDS = 1.0
DL = "/admin/jobguard/deadletter/"
JOBS = "/admin/jobguard/job/"

#: 20 tasks over 13 queues; the last four are the test app's limited tasks (a keyed
#: concurrency limit, a breaker, a shared limit), so the flow-control page has limits in use.
TASKS = [
    ("shop.tasks.charge", "payments"),
    ("shop.tasks.refund", "payments"),
    ("shop.tasks.send_receipt", "emails"),
    ("shop.tasks.send_newsletter", "emails"),
    ("shop.tasks.daily_report", "reports"),
    ("shop.tasks.monthly_report", "reports"),
    ("shop.tasks.deliver_webhook", "webhooks"),
    ("shop.tasks.retry_webhook", "webhooks"),
    ("shop.tasks.export_csv", "exports"),
    ("shop.tasks.import_feed", "imports"),
    ("shop.tasks.reindex", "search"),
    ("shop.tasks.thumbnail", "thumbnails"),
    ("shop.tasks.invoice", "billing"),
    ("shop.tasks.dunning", "billing"),
    ("shop.tasks.cleanup", "default"),
    ("shop.tasks.sync_stock", "default"),
    ("tests.testapp.tasks_flow.per_account", "flow-keyed"),
    ("tests.testapp.tasks_flow.call_dependency", "flow-dep"),
    ("tests.testapp.tasks_flow.shared_a", "flow-shared"),
    ("tests.testapp.tasks_flow.shared_b", "flow-shared"),
]
QUEUES = sorted({queue for _task, queue in TASKS})
CHAINS = 1000
BATCH_MEMBERS = 5000


def _order(order_id: int, amount: int = 0) -> None:
    """The shop's tasks: registered so the replay pages can check payloads against a handler."""


def register_tasks() -> None:
    from django_jobguard.task import task

    for name, queue in TASKS:
        if name.startswith("shop."):
            task(name=name, queue_name=queue)(_order)


def _array(values: list[str]) -> str:
    return "ARRAY[" + ", ".join(f"'{value}'" for value in values) + "]"


TASK_NAMES_SQL = _array([task for task, _queue in TASKS])
TASK_QUEUES_SQL = _array([queue for _task, queue in TASKS])

# The state of job g: every `step`-th job is dead (and has a dead letter); the rest by g % 100.
JOBS_SQL = f"""
INSERT INTO jobguard_job (id, task_name, queue_name, args, kwargs, priority, status, run_after, attempts,
    max_attempts, visibility_timeout, lease_token, lease_expires_at, worker_id, enqueued_at, started_at,
    finished_at, first_failed_at, last_error, reappearances, lock_contentions, idempotency_key, lock_key,
    handler_version, result, checkpoints, flow_keys, waiting_on, has_dependants, workflow_id)
SELECT g, t.task, t.queue, '[]', jsonb_build_object('order_id', g, 'amount', g %% 1000),
    0,
    CASE s WHEN 'due' THEN 'queued' WHEN 'scheduled' THEN 'queued' WHEN 'retrying' THEN 'queued'
        WHEN 'stuck' THEN 'running' ELSE s END,
    CASE s WHEN 'due' THEN now() - (g %% 600) * interval '1 second'
        WHEN 'scheduled' THEN now() + (g %% 3600) * interval '1 second'
        WHEN 'retrying' THEN now() + (g %% 300) * interval '1 second'
        ELSE at END,
    CASE s WHEN 'dead' THEN 5 WHEN 'retrying' THEN 2 WHEN 'due' THEN 0 WHEN 'scheduled' THEN 0
        WHEN 'waiting' THEN 0 ELSE 1 END,
    5, 60,
    CASE WHEN s IN ('running', 'stuck') THEN md5(g::text) END,
    CASE s WHEN 'running' THEN now() + interval '45 seconds'
        WHEN 'stuck' THEN now() - interval '10 minutes' END,
    CASE WHEN s IN ('due', 'scheduled', 'waiting') THEN '' ELSE 'worker-' || (g %% 8) END,
    at,
    CASE WHEN s IN ('due', 'scheduled', 'waiting') THEN NULL
        WHEN s IN ('running', 'stuck') THEN now() - interval '20 seconds' ELSE at + interval '1 second' END,
    CASE WHEN s IN ('succeeded', 'dead', 'cancelled') THEN at + interval '2 seconds' END,
    CASE WHEN s IN ('dead', 'retrying') THEN at + interval '1 second' END,
    CASE s WHEN 'dead' THEN 'ProviderTimeout: order ' || g || ' timed out after 30 s'
        WHEN 'retrying' THEN 'ProviderTimeout: order ' || g WHEN 'cancelled' THEN 'cancelled by an operator'
        ELSE '' END,
    0, 0,
    CASE WHEN g %% 3 = 0 OR s = 'dead' THEN 'order-' || g END,
    CASE WHEN g %% 4 = 0 THEN 'lock:order:' || g ELSE '' END,
    '', CASE WHEN s = 'succeeded' THEN jsonb_build_object('charged', g %% 1000) END, '{{}}',
    CASE WHEN t.task LIKE '%%.per_account'
        THEN jsonb_build_array('c:' || t.task || '|account:' || (g %% 50)) ELSE '[]'::jsonb END,
    CASE WHEN s = 'waiting' THEN 1 ELSE 0 END,
    false,
    CASE WHEN g <= %(chains)s * 3 THEN 1 + (g - 1) / 3
        WHEN g > %(jobs)s - %(batch)s THEN %(chains)s + 1 END
FROM (
    SELECT g,
        CASE WHEN g %% %(step)s = 0 THEN 'dead'
            WHEN g %% 100 = 1 THEN 'due' WHEN g %% 100 = 2 THEN 'scheduled' WHEN g %% 100 = 3 THEN 'retrying'
            WHEN g %% 100 = 4 THEN 'running' WHEN g %% 100 = 5 THEN 'stuck' WHEN g %% 100 = 6 THEN 'waiting'
            WHEN g %% 100 = 7 THEN 'cancelled' ELSE 'succeeded' END AS s,
        now() - (%(jobs)s - g) * interval '6 seconds' AS at
    FROM generate_series(1, %(jobs)s) AS g
) AS j
CROSS JOIN LATERAL (
    -- Dead jobs are every step-th: (g + g / 10) spreads them, too, over every task.
    SELECT ({TASK_NAMES_SQL})[1 + (g + g / 10) %% 20] AS task,
        ({TASK_QUEUES_SQL})[1 + (g + g / 10) %% 20] AS queue
) AS t
"""

# Dead letter n is the letter of job n * step: its task, queue, payload and key.
DEAD_LETTERS_SQL = """
INSERT INTO jobguard_deadletter (id, job_id, task_name, queue_name, args, kwargs, attempts, max_attempts,
    reason, category, error_class, error_message, traceback, first_failed_at, last_failed_at,
    handler_version, worker_id, idempotency_key, lock_key, created_at, replay_state, replay_args,
    replay_kwargs, replay_requested_at, replay_reason, replay_decided_at, replayed_at)
SELECT n, j.id, j.task_name, j.queue_name, j.args, j.kwargs, 5, 5,
    CASE WHEN n %% 3 = 0 THEN 'permanent_error' ELSE 'retries_exhausted' END,
    CASE WHEN n %% 3 = 0 THEN 'permanent' ELSE 'transient' END,
    'ProviderTimeout' || (n %% 7), 'order ' || j.id || ' timed out after 30 s',
    'Traceback (most recent call last):' || repeat(E'\n  File "shop/tasks.py", line 42, in charge', 12),
    j.finished_at - interval '1 minute', j.finished_at, '', j.worker_id, j.idempotency_key, j.lock_key,
    j.finished_at,
    r.state,
    CASE WHEN r.corrected THEN j.args END,
    CASE WHEN r.corrected THEN j.kwargs || '{"amount": 500}'::jsonb END,
    CASE WHEN r.state <> 'none' THEN j.finished_at + interval '1 hour' END,
    CASE WHEN r.state <> 'none' THEN 'incident 7: the provider timed out' ELSE '' END,
    CASE WHEN r.state IN ('approved', 'rejected', 'replayed') THEN j.finished_at + interval '2 hours' END,
    CASE WHEN r.state = 'replayed' THEN j.finished_at + interval '3 hours' END
FROM generate_series(1, %(letters)s) AS n
JOIN jobguard_job AS j ON j.id = n * %(step)s
CROSS JOIN LATERAL (
    SELECT CASE WHEN n %% 20 < 14 THEN 'none' WHEN n %% 20 < 16 THEN 'requested'
        WHEN n %% 20 = 16 THEN 'approved' WHEN n %% 20 = 17 THEN 'rejected' ELSE 'replayed' END AS state,
        n %% 20 = 14 AND n %% 100 < 50 AS corrected
) AS r
"""

REPLAY_EVENTS_SQL = """
INSERT INTO jobguard_replayevent (dead_letter_id, action, actor_name, reason, data, created_at)
SELECT d.id, a.action, CASE WHEN a.action = 'requested' THEN 'rita' ELSE 'alex' END, d.replay_reason,
    CASE WHEN a.action = 'requested' AND d.replay_kwargs IS NOT NULL
        THEN jsonb_build_object('kwargs', d.replay_kwargs) ELSE '{}'::jsonb END,
    d.replay_requested_at + a.n * interval '1 hour'
FROM jobguard_deadletter AS d
CROSS JOIN LATERAL (VALUES ('requested', 0), ('approved', 1), ('rejected', 1), ('replayed', 2))
    AS a(action, n)
WHERE d.replay_state <> 'none' AND (a.action = 'requested'
    OR (a.action = 'approved' AND d.replay_state IN ('approved', 'replayed'))
    OR a.action = d.replay_state)
"""

KEYS_SQL = """
INSERT INTO jobguard_idempotencykey (key, scope, fingerprint, status, result, job_id, duplicates, created_at,
    updated_at, expires_at)
SELECT idempotency_key, task_name, md5(id::text),
    CASE WHEN status = 'succeeded' THEN 'succeeded' WHEN status = 'dead' THEN 'failed' ELSE 'in_progress' END,
    NULL, id, 0, enqueued_at, enqueued_at, now() + interval '7 days'
FROM jobguard_job WHERE idempotency_key IS NOT NULL
"""

WORKFLOWS_SQL = [
    """INSERT INTO jobguard_workflow (id, kind, state, name, callbacks, created_at, closed_at, finished_at)
    SELECT w, 'chain', 'finished', 'order pipeline ' || w, '{}', now() - interval '7 days',
        now() - interval '7 days', now() - interval '7 days' + interval '10 seconds'
    FROM generate_series(1, %(chains)s) AS w""",
    """INSERT INTO jobguard_workflow (id, kind, state, name, callbacks, created_at, closed_at)
    VALUES (%(chains)s + 1, 'batch', 'closed', 'nightly re-index', '{}', now() - interval '8 hours',
        now() - interval '8 hours')""",
    """INSERT INTO jobguard_workflowcounter (workflow_id, shard, pending, succeeded, failed)
    SELECT workflow_id, id %% 256, count(*) FILTER (WHERE status NOT IN ('succeeded', 'dead', 'cancelled')),
        count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status IN ('dead', 'cancelled'))
    FROM jobguard_job WHERE workflow_id IS NOT NULL GROUP BY workflow_id, id %% 256""",
    "SELECT setval(pg_get_serial_sequence('jobguard_workflow', 'id'), "
    "(SELECT max(id) FROM jobguard_workflow))",
]

LOCKS_SQL = [
    # The running jobs' locks (the stuck ones' holders are gone), and free rows kept for their counters.
    """INSERT INTO jobguard_lock (key, token, expires_at, fencing_token, acquired_at)
    SELECT lock_key, 'job.' || id || '.' || left(encode(sha256(lease_token::bytea), 'hex'), 16) || '.'
        || left(md5(id::text || 'lock'), 8), now() + interval '5 minutes', id, started_at
    FROM jobguard_job WHERE status = 'running' AND lock_key <> ''""",
    """INSERT INTO jobguard_lock (key, token, expires_at, fencing_token, acquired_at)
    SELECT 'lock:report:' || g, NULL, NULL, g, NULL FROM generate_series(1, 2000) AS g""",
    """INSERT INTO jobguard_lockrelease (key, actor_name, reason, fencing_token, holder_job_id, created_at)
    SELECT 'lock:report:' || g, 'alex', 'the holder was SIGKILLed', g, NULL, now() - g * interval '1 hour'
    FROM generate_series(1, 20) AS g""",
]

OTHER_SQL = [
    """INSERT INTO jobguard_workerbeat (worker_id, host, pid, queues, concurrency, started_at, last_beat_at,
        jobs_in_hand, async_slots, async_in_use, loop_lag_ms)
    SELECT 'worker-' || g, 'host-' || (g %% 4), 1000 + g, '*', 8, now() - interval '2 hours',
        CASE WHEN g < 6 THEN now() ELSE now() - interval '10 minutes' END, 4, 0, 0, 0
    FROM generate_series(0, 7) AS g""",
    """INSERT INTO jobguard_breaker (name, state, open_until, manual, probes, half_open_since, window_start,
        calls, failures, budget_start, first_attempts, retries, changed_at, changed_by_name, reason)
    VALUES ('flow-dep', 'open', extract(epoch FROM now()) + 60, false, 0, NULL, extract(epoch FROM now()) - 5,
        40, 31, extract(epoch FROM now()) - 2, 120, 60, now() - interval '5 minutes', '',
        '31 of 40 calls failed')""",
    """INSERT INTO jobguard_breakerevent (name, from_state, to_state, actor_name, reason, created_at)
    SELECT 'flow-dep', CASE WHEN g %% 2 = 0 THEN 'closed' ELSE 'open' END,
        CASE WHEN g %% 2 = 0 THEN 'open' ELSE 'closed' END, '', 'failure rate over 50%%',
        now() - g * interval '1 hour'
    FROM generate_series(1, 50) AS g""",
    """INSERT INTO jobguard_schedule (name, task_name, cron, timezone, args, kwargs, queue_name, missed,
        source, paused, next_tick_at, last_tick_at, created_at, updated_at)
    SELECT 'nightly-' || g, 'shop.tasks.daily_report', (g %% 60) || ' 3 * * *', 'UTC', '[]', '{}', 'reports',
        'run_once', 'settings', g %% 10 = 0, now() + interval '1 day', now() - interval '1 day', now(), now()
    FROM generate_series(1, 40) AS g""",
    # An hour of per-minute history for each queue (the health page's charts).
    f"""INSERT INTO jobguard_queueminute (queue_name, minute, succeeded, failed, retried, dead_lettered,
        oldest_age_seconds)
    SELECT q, date_trunc('minute', now()) - m * interval '1 minute', 100 + m, m %% 7, m %% 5, m %% 3, m * 2.0
    FROM unnest({_array(QUEUES)}) AS q CROSS JOIN generate_series(0, 59) AS m""",
    """INSERT INTO jobguard_queuestate (queue_name, paused, changed_by_name, changed_at, reason)
    VALUES ('reports', true, 'alex', now() - interval '20 minutes', 'the warehouse is being migrated')""",
    """INSERT INTO jobguard_queueevent (queue_name, action, actor_name, reason, created_at)
    VALUES ('reports', 'pause', 'alex', 'the warehouse is being migrated', now() - interval '20 minutes')""",
]

TABLES = [
    "jobguard_replayevent",
    "jobguard_deadletter",
    "jobguard_idempotencykey",
    "jobguard_workflowcounter",
    "jobguard_workflowcallback",
    "jobguard_workflow",
    "jobguard_job",
    "jobguard_lock",
    "jobguard_lockrelease",
    "jobguard_workerbeat",
    "jobguard_breaker",
    "jobguard_breakerevent",
    "jobguard_schedule",
    "jobguard_queueminute",
    "jobguard_queuestate",
    "jobguard_queueevent",
]


def fill(jobs: int, letters: int) -> float:
    """Lay the rows; return the seconds it took."""
    from django.db import connection

    began = time.perf_counter()
    step = max(1, jobs // max(1, letters))
    params = {"jobs": jobs, "letters": min(letters, jobs // step), "step": step}
    params.update(chains=min(CHAINS, jobs // 6), batch=min(BATCH_MEMBERS, jobs // 4))
    execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE")
    execute(JOBS_SQL, params)  # type: ignore[arg-type]
    execute("SELECT setval(pg_get_serial_sequence('jobguard_job', 'id'), (SELECT max(id) FROM jobguard_job))")
    execute(DEAD_LETTERS_SQL, params)  # type: ignore[arg-type]
    execute(
        "SELECT setval(pg_get_serial_sequence('jobguard_deadletter', 'id'), "
        "(SELECT max(id) FROM jobguard_deadletter))"
    )
    execute(REPLAY_EVENTS_SQL)
    execute(KEYS_SQL)
    for sql in WORKFLOWS_SQL:
        execute(sql, params)  # type: ignore[arg-type]
    for sql in LOCKS_SQL + OTHER_SQL:
        execute(sql)
    connection.set_autocommit(True)
    for table in TABLES:
        execute(f"VACUUM ANALYZE {table}")
    return time.perf_counter() - began


@dataclass
class Page:
    label: str
    url: str
    post: dict[str, Any] | None = None
    #: Also requested as the user without jobguard.view_payload.
    both: bool = False


@dataclass
class Figure:
    label: str
    user: str
    url: str
    median: float
    slowest: float
    queries: int
    slowest_query_ms: float
    slowest_sql: str
    status: int
    samples: list[float] = field(default_factory=list)

    @property
    def under(self) -> bool:
        return self.slowest < BUDGET_SECONDS


def pages(ids: dict[str, Any]) -> list[Page]:
    """The console's pages, each with the data the fill laid."""
    select_all = {"action": "", "select_across": "1", "index": "0", "_selected_action": ids["letter"]}
    return [
        Page("admin index", "/admin/"),
        Page("jobguard app index", "/admin/jobguard/"),
        Page("jobs", JOBS, both=True),
        *(
            Page(f"jobs: state {state}", f"{JOBS}?state={state}")
            for state in (
                "due",
                "scheduled",
                "retrying",
                "running",
                "stuck",
                "waiting",
                "succeeded",
                "dead",
                "cancelled",
            )
        ),
        Page("jobs: queue", f"{JOBS}?queue_name=payments"),
        Page("jobs: task", f"{JOBS}?task_name=shop.tasks.charge"),
        Page("jobs: enqueued 1h", f"{JOBS}?enqueued=1h"),
        Page("jobs: queue + state dead", f"{JOBS}?queue_name=payments&state=dead"),
        Page("jobs: search id", f"{JOBS}?q={ids['job']}"),
        Page("jobs: search lock key", f"{JOBS}?q=lock:order:{ids['lock_job']}"),
        Page("jobs: search idem. key", f"{JOBS}?q=order-{ids['key_job']}", both=True),
        Page("jobs: older page (id__lt)", f"{JOBS}?id__lt={ids['job']}"),
        Page("jobs: Show counts", f"{JOBS}?_facets=True", both=True),
        Page("jobs: Show counts, state dead", f"{JOBS}?state=dead&_facets=True"),
        Page("jobs: Show counts, queue", f"{JOBS}?queue_name=payments&_facets=True"),
        Page("jobs: Show counts, task", f"{JOBS}?task_name=shop.tasks.charge&_facets=True"),
        Page("job page (dead, letter)", f"{JOBS}{ids['dead_job']}/change/", both=True),
        Page("job page (batch member)", f"{JOBS}{ids['member']}/change/"),
        Page("dead letters", DL, both=True),
        Page("dead letters: requested", f"{DL}?replay_state__exact=requested"),
        Page("dead letters: unresolved", f"{DL}?replay_state__in=none,requested,approved"),
        Page("dead letters: reason", f"{DL}?reason__exact=permanent_error"),
        Page("dead letters: category", f"{DL}?category__exact=transient"),
        Page("dead letters: queue", f"{DL}?queue_name=payments"),
        Page("dead letters: task", f"{DL}?task_name=shop.tasks.charge"),
        Page("dead letters: error class", f"{DL}?error_class=ProviderTimeout3"),
        Page("dead letters: created today", f"{DL}?created_at__gte={ids['today']}%2B00:00"),
        Page("dead letters: search class", f"{DL}?q=ProviderTimeout3", both=True),
        Page("dead letters: search id", f"{DL}?q={ids['letter']}"),
        Page("dead letters: prefix order-50*", f"{DL}?q=order-50*", both=True),
        Page("dead letters: Show counts", f"{DL}?_facets=True", both=True),
        Page("dead letters: Show counts, requested", f"{DL}?replay_state__exact=requested&_facets=True"),
        Page("dead letter page (corrected)", f"{DL}{ids['corrected']}/change/", both=True),
        Page("dead letter page (replayed)", f"{DL}{ids['replayed']}/change/"),
        Page("bulk request, select all", DL, {**select_all, "action": "request_replays"}, both=True),
        Page(
            "bulk request, batch of 500",
            DL,
            {
                **select_all,
                "action": "request_replays",
                "batch": "1",
                "batch-first": "500",
                "preview": "1",
                "confirm": "1",
            },
        ),
        Page(
            "bulk approve, all requested",
            f"{DL}?replay_state__exact=requested",
            {**select_all, "action": "approve_replays", "_selected_action": ids["corrected"]},
            both=True,
        ),
        Page("replay form (approve)", f"{DL}{ids['corrected']}/replay/approve/"),
        Page("redrive rate", f"{DL}redrive-rate/"),
        Page("queue health (triage)", "/admin/jobguard/queuestate/", both=True),
        Page("queue health, one queue", "/admin/jobguard/queuestate/?queue=payments"),
        Page("flow control", "/admin/jobguard/breaker/"),
        Page("breaker history", "/admin/jobguard/breakerevent/"),
        Page("locks", "/admin/jobguard/lock/"),
        Page("locks: held", "/admin/jobguard/lock/?held=held"),
        Page("lock page", f"/admin/jobguard/lock/{ids['lock']}/change/"),
        Page("lock releases", "/admin/jobguard/lockrelease/"),
        Page("workers", "/admin/jobguard/workerbeat/"),
        Page("workflows", "/admin/jobguard/workflow/"),
        Page("workflow page (batch 5,000)", f"/admin/jobguard/workflow/{ids['batch']}/change/"),
        Page("workflow page (chain)", "/admin/jobguard/workflow/1/change/"),
        Page("schedules", "/admin/jobguard/schedule/"),
        Page("queue events", "/admin/jobguard/queueevent/"),
        Page("idempotency keys", "/admin/jobguard/idempotencykey/"),
        Page("idempotency keys: search", f"/admin/jobguard/idempotencykey/?q=order-{ids['key_job']}"),
    ]


def measure(client: Any, user: str, page: Page, runs: int) -> Figure:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def request() -> Any:
        if page.post is None:
            return client.get(page.url)
        return client.post(page.url, page.post)

    with CaptureQueriesContext(connection) as ctx:
        response = request()
    # Read now: the next request's request_started signal empties the connection's query log.
    queries = list(ctx.captured_queries)
    if response.status_code not in (200, 302):
        raise SystemExit(f"{page.label} ({user}): {page.url} answered {response.status_code}")
    slowest = max(queries, key=lambda q: float(q["time"]), default={"time": "0", "sql": ""})
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        request()
        samples.append(time.perf_counter() - began)
    return Figure(
        page.label,
        user,
        page.url,
        statistics.median(samples),
        max(samples),
        len(queries),
        float(slowest["time"]) * 1000,
        slowest["sql"],
        response.status_code,
        samples,
    )


def explain(sql: str) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("JOBGUARD_BENCH_DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--dead-letters", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5, help="timed requests per page (median and max)")
    parser.add_argument("--keep", action="store_true", help="reuse the rows of an earlier run")
    parser.add_argument(
        "--explain", action="store_true", help="EXPLAIN ANALYZE each slow page's slowest query"
    )
    parser.add_argument("--only", default="", help="only the pages whose label contains this")
    args = parser.parse_args()

    load_start = os.getloadavg()
    ensure_database(args.database_url)
    setup_django(args.database_url)
    from django.contrib.auth.models import Permission, User
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import setup_test_environment

    from django_jobguard.models import DeadLetter, Job, Lock
    from django_jobguard.registry import registry
    from tests.testapp import tasks_dlq, tasks_flow  # noqa: F401 - the limits and tasks the rows name

    setup_test_environment()  # the test client's host
    register_tasks()
    call_command("migrate", verbosity=0)
    filled = 0.0
    if not args.keep or Job.objects.count() != args.jobs:
        filled = fill(args.jobs, args.dead_letters)

    admin, _ = User.objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    operator, _ = User.objects.get_or_create(username="bench-operator", defaults={"is_staff": True})
    operator.user_permissions.set(
        Permission.objects.filter(content_type__app_label="jobguard").exclude(codename="view_payload")
    )
    clients = {"superuser": Client(), "no view_payload": Client()}
    clients["superuser"].force_login(admin)
    clients["no view_payload"].force_login(operator)

    letters = DeadLetter.objects.order_by("id")
    ids = {
        "job": args.jobs // 2,
        "lock_job": args.jobs // 2 // 4 * 4,
        "key_job": args.jobs // 2 // 3 * 3,
        "dead_job": letters.values_list("job_id", flat=True)[letters.count() // 2],
        "member": Job.objects.filter(workflow_id__isnull=False)
        .values_list("id", flat=True)
        .order_by("-id")[0],
        "letter": letters.values_list("id", flat=True)[letters.count() // 2],
        "corrected": letters.filter(replay_kwargs__isnull=False).values_list("id", flat=True)[0],
        "replayed": letters.filter(replay_state="replayed").values_list("id", flat=True)[0],
        "lock": Lock.objects.filter(token__isnull=False).order_by("key").values_list("key", flat=True)[0],
        "batch": min(CHAINS, args.jobs // 6) + 1,
        "today": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT00:00:00"),
    }
    counts = {
        "jobs": Job.objects.count(),
        "dead letters": letters.count(),
        "corrected": letters.filter(replay_kwargs__isnull=False).count(),
        "requested": letters.filter(replay_state="requested").count(),
        # The job list's task filter has one option per registered task: Show counts counts each.
        "tasks registered": len(list(registry.names())),
    }
    figures: list[Figure] = []
    for page in pages(ids):
        if args.only and args.only not in page.label:
            continue
        for user in ("superuser", "no view_payload") if page.both else ("superuser",):
            figures.append(measure(clients[user], user, page, args.runs))
    load_end = os.getloadavg()

    print(
        f"{counts['jobs']:,} jobs, {counts['dead letters']:,} dead letters ({counts['requested']:,} "
        f"requested, {counts['corrected']:,} of them corrected); {counts['tasks registered']} tasks "
        "registered; PostgreSQL, Django's test client"
    )
    print(
        f"host: {platform.node()}, {os.cpu_count()} CPUs, {platform.python_implementation()} "
        f"{platform.python_version()}; load average {load_start[0]:.2f} {load_start[1]:.2f} "
        f"{load_start[2]:.2f} at the start, {load_end[0]:.2f} at the end"
        + (f"; fill {filled:.0f} s" if filled else "; rows kept")
    )
    print(f"each page: one counted request, then {args.runs} timed (median, slowest)\n")
    header = f"{'page':<37} {'user':<15} {'median ms':>9} {'max ms':>8} {'queries':>7} {'top q ms':>8}  < 1 s"
    print(header)
    print("-" * len(header))
    for f in figures:
        print(
            f"{f.label:<37} {f.user:<15} {f.median * 1000:9.0f} {f.slowest * 1000:8.0f} {f.queries:7d} "
            f"{f.slowest_query_ms:8.1f}  {'yes' if f.under else 'NO'}"
        )
    over = [f for f in figures if not f.under]
    print(f"\n{len(figures) - len(over)} of {len(figures)} pages under {BUDGET_SECONDS:g} s")
    for f in over:
        print(f"\nover budget: {f.label} ({f.user}) {f.url}: slowest query {f.slowest_query_ms:.0f} ms:")
        print("  " + f.slowest_sql[:600])
        if args.explain:
            print(explain(f.slowest_sql))

    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    data = {
        "counts": counts,
        "runs": args.runs,
        "load_average_start": load_start,
        "load_average_end": load_end,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "pages": [
            {
                "page": f.label,
                "user": f.user,
                "url": f.url,
                "median_ms": round(f.median * 1000, 1),
                "max_ms": round(f.slowest * 1000, 1),
                "queries": f.queries,
                "slowest_query_ms": round(f.slowest_query_ms, 1),
                "samples_ms": [round(s * 1000, 1) for s in f.samples],
            }
            for f in figures
        ],
    }
    (RESULTS / f"console-{stamp}.json").write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
