"""The README's first command: the example shop's demo, run on a fresh copy of the project.

The demo proves its guarantees from the database and writes its figures as JSON; these
tests read the same database themselves (SQL, not the demo's code) and check that the
figures are true, so a demo that claimed more than it did would fail here.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import select
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.processes, pytest.mark.slow]

ORDERS = 240
#: The demo's plan (shop/demo/acts.py): every fourth order submitted twice, 30 charges
#: resent by the producer, 6 account updates delivered twice.
DOUBLE_SUBMISSIONS = sum(1 for i in range(ORDERS) if i % 4 == 1)
EXPECTED_DUPLICATES = DOUBLE_SUBMISSIONS + 30 + 6

Query = Callable[[str], list[tuple[Any, ...]]]


def copy_project(tmp_path: Path) -> Path:
    project = tmp_path / "example_project"
    shutil.copytree(
        ROOT / "example_project",
        project,
        ignore=shutil.ignore_patterns("db.sqlite3*", "__pycache__", ".cache"),
    )
    return project


def manage(project: Path, *args: str, expect_code: int = 0, both: bool = False, **env_extra: str) -> str:
    """Run manage.py in ``project`` with a clean environment; stdout (and stderr with ``both``),
    or stderr if it failed."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "JOBGUARD_")) and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.update(env_extra)
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == expect_code, (result.stdout + result.stderr)[-6000:]
    if both:
        return result.stdout + result.stderr
    return result.stdout if expect_code == 0 else result.stderr


def run_demo(project: Path, **env: str) -> tuple[str, dict[str, Any]]:
    manage(project, "migrate", "--verbosity", "0", **env)
    summary_path = project / "summary.json"
    out = manage(project, "shop_demo", "--orders", str(ORDERS), "--summary-json", str(summary_path), **env)
    return out, json.loads(summary_path.read_text())


def figures(summary: dict[str, Any], act: str, guarantee_word: str = "") -> dict[str, Any]:
    found = [p for p in summary["proofs"] if p["act"] == act and guarantee_word in p["guarantee"]]
    assert len(found) == 1, (act, guarantee_word, summary["proofs"])
    return found[0]["figures"]


def check_against_database(out: str, summary: dict[str, Any], query: Query) -> None:
    """Every figure the demo reports, recomputed here from the rows."""
    # The plain (non-terminal) output: progress lines, then the table and the next step.
    assert "succeeded=" in out and "lock_contentions=" in out, out[-3000:]
    assert "What the database says" in out and " NO " not in out, out[-6000:]
    assert "approver / approver-demo" in out, out[-2000:]
    assert summary["ok"] is True, json.dumps(summary, indent=2)[-4000:]

    # Orders charged exactly once: one provider charge per paid order, under its key, and
    # the payment carries that charge's reference.
    orders = figures(summary, "orders", "charged exactly once")
    [(n_orders, n_paid)] = query("SELECT COUNT(*), SUM(CASE WHEN paid THEN 1 ELSE 0 END) FROM shop_order")
    assert n_orders == orders["orders"] == ORDERS
    assert n_paid == orders["paid"] == ORDERS - 1
    [(n_payments,)] = query("SELECT COUNT(*) FROM shop_payment")
    [(n_charges,)] = query("SELECT COUNT(*) FROM shop_providercharge")
    [(n_matched,)] = query(
        "SELECT COUNT(*) FROM shop_payment p JOIN shop_providercharge c "
        "ON c.idempotency_key = 'charge:order:' || p.order_id AND c.reference = p.provider_ref"
    )
    assert n_payments == n_charges == n_matched == orders["payments"] == orders["provider_charges"] == n_paid
    # One charge job per order whatever was submitted; the duplicates were stopped by keys.
    assert query(
        "SELECT COUNT(*), COUNT(DISTINCT idempotency_key) FROM jobguard_job "
        "WHERE task_name = 'shop.tasks.charge_order'"
    ) == [(ORDERS, ORDERS)]
    [(stopped,)] = query("SELECT SUM(duplicates) FROM jobguard_idempotencykey")
    resend = figures(summary, "resend")
    assert orders["double_submissions"] == DOUBLE_SUBMISSIONS
    assert (
        stopped
        == resend["duplicates_stopped"]
        == summary["totals"]["duplicates_stopped"]
        == EXPECTED_DUPLICATES
    )
    assert resend["resend_new_jobs"] == 0
    # The enqueuing process's Prometheus counter saw the same duplicates.
    assert resend["duplicates_counted_by_metric"] == stopped

    # Receipts: one per paid order; the slow mail domain's took three calls each.
    [(n_receipts,)] = query("SELECT COUNT(*) FROM shop_sentreceipt")
    assert n_receipts == n_paid
    retries = figures(summary, "retries")
    calls = query(
        "SELECT idempotency_key, COUNT(*), SUM(CASE WHEN outcome = 'sent' THEN 1 ELSE 0 END) "
        "FROM shop_mailcall GROUP BY idempotency_key HAVING COUNT(*) > 1"
    )
    assert len(calls) == retries["flaky_receipts"] == 12
    assert {(n, sent) for _, n, sent in calls} == {(3, 1)}
    [(email_attempts,)] = query(
        "SELECT SUM(attempts) FROM jobguard_job WHERE task_name = 'shop.tasks.send_receipt'"
    )
    assert email_attempts == n_paid + 2 * 12
    assert summary["totals"]["retried"] == 2 * 12

    # Locks: contention happened, used no attempt, and no two syncs of one order overlapped.
    locks = figures(summary, "locks")
    [(contentions, most_attempts, succeeded)] = query(
        "SELECT SUM(lock_contentions), MAX(attempts), SUM(CASE WHEN status = 'succeeded' THEN 1 ELSE 0 END) "
        "FROM jobguard_job WHERE task_name = 'shop.tasks.sync_order'"
    )
    assert contentions == locks["lock_contentions"] and contentions >= 1
    assert (most_attempts, succeeded) == (1, 30)
    assert query(
        "SELECT COUNT(*) FROM shop_ordersync a JOIN shop_ordersync b ON a.order_id = b.order_id "
        "AND a.id < b.id AND b.started_at < a.finished_at AND a.started_at < b.finished_at"
    ) == [(0,)]

    # The killed worker: the jobs it held reappeared and another worker finished them once.
    crash = figures(summary, "crash")
    held = crash["held_by_killed_worker"]
    assert held, crash
    ids = ", ".join(str(int(pk)) for pk in held)
    rows = query(f"SELECT status, reappearances, worker_id FROM jobguard_job WHERE id IN ({ids})")
    assert len(rows) == len(held)
    assert all(
        status == "succeeded" and reappeared >= 1 and worker != "worker-killed"
        for status, reappeared, worker in rows
    ), rows
    [(started_by_victim,)] = query("SELECT COUNT(*) FROM shop_packingstart WHERE worker_id = 'worker-killed'")
    assert started_by_victim >= 1
    assert query("SELECT COUNT(*), COUNT(DISTINCT order_id) FROM shop_shipment") == [(4, 4)]

    # The slow export ran once, past the fulfilment queue's visibility timeout.
    assert query(
        "SELECT status, attempts, reappearances FROM jobguard_job "
        "WHERE task_name = 'shop.tasks.export_orders'"
    ) == [("succeeded", 1, 0)]
    [(export_seconds,)] = query("SELECT seconds FROM shop_export")
    assert export_seconds >= 4.0

    # The nightly report: a batch of four tallies, finished, and its callback enqueued and run once.
    report = figures(summary, "report")
    wf = int(report["workflow_id"])
    assert query(f"SELECT kind, state FROM jobguard_workflow WHERE id = {wf}") == [("batch", "finished")]
    assert query(f"SELECT status, COUNT(*) FROM jobguard_job WHERE workflow_id = {wf} GROUP BY status") == [
        ("succeeded", 4)
    ]
    [(when, callback)] = query(
        f'SELECT "when", job_id FROM jobguard_workflowcallback WHERE workflow_id = {wf}'
    )
    assert (when, callback) == ("complete", report["report_job_id"])
    assert query(f"SELECT task_name, status, attempts FROM jobguard_job WHERE id = {int(callback)}") == [
        ("shop.tasks.build_report", "succeeded", 1)
    ]

    # Account balances: the sum of the updates that ran, each once.
    jobs = query(
        "SELECT kwargs FROM jobguard_job WHERE task_name = 'shop.tasks.apply_account_update' "
        "AND status = 'succeeded'"
    )
    expected: dict[int, Decimal] = {}
    for (kwargs,) in jobs:
        data = kwargs if isinstance(kwargs, dict) else json.loads(kwargs)
        expected[data["account_id"]] = expected.get(data["account_id"], Decimal(0)) + Decimal(data["amount"])
    balances = {
        pk: Decimal(str(balance))
        for pk, balance in query("SELECT id, balance FROM shop_account WHERE updates > 0")
    }
    assert balances == expected and len(expected) == 20
    cache = figures(summary, "cache")
    assert cache["summaries_invalidated"] == cache["balances_right"] == 20
    assert figures(summary, "orders", "cached summaries")["order_summaries_invalidated"] == n_paid

    # Dead letters with their reasons; the corrected webhook replay waits for the approver.
    letters = sorted(query("SELECT task_name, reason, error_class, replay_state FROM jobguard_deadletter"))
    assert [(t, r, e.rsplit(".", 1)[-1], s) for t, r, e, s in letters] == [
        ("shop.tasks.charge_order", "permanent_error", "CardDeclinedError", "none"),
        ("shop.tasks.import_partner_order", "permanent_error", "MalformedPayloadError", "requested"),
    ]
    assert query(
        "SELECT u.username FROM jobguard_deadletter d JOIN auth_user u ON u.id = d.replay_requested_by_id"
    ) == [("requester",)]
    assert query(
        "SELECT u.username FROM auth_user u JOIN auth_user_user_permissions up ON up.user_id = u.id "
        "JOIN auth_permission p ON p.id = up.permission_id WHERE p.codename = 'approve_replay'"
    ) == [("approver",)]
    assert summary["totals"]["dead"] == 2

    # The recurring clock job: one job per tick key, two seconds apart, each run once.
    ticked = figures(summary, "schedule")
    per_key = query(
        "SELECT idempotency_key, COUNT(*), SUM(CASE WHEN status = 'succeeded' THEN 1 ELSE 0 END) "
        "FROM jobguard_job WHERE idempotency_key LIKE 'schedule:%' GROUP BY idempotency_key"
    )
    prefix = "schedule:shop.tasks.clock_tick:"
    assert per_key and all(key.startswith(prefix) for key, _, _ in per_key), per_key
    assert {(n, ok) for _, n, ok in per_key} == {(1, 1)}, per_key
    assert len(per_key) == ticked["ticks"] == ticked["jobs"] == ticked["succeeded"] >= 3
    assert ticked["max_jobs_per_tick"] == 1
    times = sorted(datetime.datetime.fromisoformat(key.removeprefix(prefix)) for key, _, _ in per_key)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert set(gaps) == {2.0} and ticked["gaps"] == 0, gaps
    assert (
        query(
            "SELECT COUNT(*) FROM shop_clocktick h JOIN jobguard_job j ON j.id = h.job_id "
            "AND j.idempotency_key = h.tick_key AND j.worker_id = h.worker_id"
        )
        == [(len(per_key),)]
        == [(ticked["tick_rows"],)]
    )
    ran_by = dict(
        query(
            "SELECT worker_id, COUNT(*) FROM jobguard_job WHERE idempotency_key LIKE 'schedule:%' "
            "GROUP BY worker_id"
        )
    )
    assert ran_by == ticked["ran_by"] and "" not in ran_by, ran_by
    # The approver paused it once the other acts were done, so no tick was left queued.
    [(paused, removed_at)] = query(
        "SELECT paused, removed_at FROM jobguard_schedule WHERE name = 'shop.tasks.clock_tick'"
    )
    assert bool(paused) and removed_at is None
    # Nothing left behind: no job queued or running once the workers stopped.
    assert query("SELECT COUNT(*) FROM jobguard_job WHERE status IN ('queued', 'running')") == [(0,)]


#: The console step, as the newcomer does it: the requester may not approve replays, the
#: approver approves the one waiting in the admin (the demo's users and passwords), sending
#: back the correction digest its approve page carries, as the browser's form does.
CONSOLE_STEP = """
import re
from django.test import Client
from django_jobguard.models import DeadLetter
letter = DeadLetter.objects.get(replay_state="requested")
url = f"/admin/jobguard/deadletter/{letter.pk}/replay/approve/"
requester = Client(HTTP_HOST="127.0.0.1")
assert requester.login(username="requester", password="requester-demo")
print("requester:", requester.post(url, {"reason": "mine"}).content.decode())
approver = Client(HTTP_HOST="127.0.0.1")
assert approver.login(username="approver", password="approver-demo")
form = approver.get(url).content.decode()
digest = re.search(r'name="correction_digest" value="([0-9a-f]+)"', form).group(1)
approval = {"reason": "checked with the partner", "correction_digest": digest}
print("approver:", approver.post(url, approval).status_code)
"""


def approve_in_the_console(project: Path, query: Query, **env: str) -> None:
    out = manage(project, "shell", "-c", CONSOLE_STEP, **env)
    assert "requester may not approve replays: that needs the jobguard.approve_replay permission." in out, (
        out[-3000:]
    )
    assert "approver: 302" in out, out
    assert query("SELECT replay_state FROM jobguard_deadletter WHERE replay_state != 'none'") == [
        ("approved",)
    ]
    # A worker redrives the approved replay; the corrected payload imports the partner's order.
    assert "succeeded=1" in manage(project, "jobguard_worker", "--burst", **env)
    assert query("SELECT replay_state FROM jobguard_deadletter WHERE replay_state != 'none'") == [
        ("replayed",)
    ]
    [(amount,)] = query("SELECT amount FROM shop_partnerorder WHERE reference = 'partner-7002'")
    assert Decimal(str(amount)) == Decimal("19.90")


@contextmanager
def sqlite_query(path: Path) -> Iterator[Query]:
    with closing(sqlite3.connect(path)) as conn:
        yield lambda sql: [tuple(row) for row in conn.execute(sql).fetchall()]


def test_the_demo_proves_every_guarantee_from_the_database_on_sqlite(tmp_path: Path) -> None:
    project = copy_project(tmp_path)
    out, summary = run_demo(project)
    assert summary["database"] == "sqlite" and summary["lock_backend"] == "database"
    with sqlite_query(project / "db.sqlite3") as query:
        check_against_database(out, summary, query)
        assert "jobguard audit: nothing found" in manage(project, "jobguard_audit")
        # The example follows the docs' checklist: no jobguard check has anything to say, with
        # the durations the demo just recorded either.
        checked = manage(project, "check", "--database", "default", both=True)
        assert "(jobguard." not in checked, checked
        assert "System check identified no issues" in checked, checked
        approve_in_the_console(project, query)


def test_the_demo_refuses_too_few_orders_and_enqueues_nothing(tmp_path: Path) -> None:
    project = copy_project(tmp_path)
    manage(project, "migrate", "--verbosity", "0")
    err = manage(project, "shop_demo", "--orders", "3", expect_code=1)
    assert "--orders 3: the demo needs at least 40 orders." in err
    with sqlite_query(project / "db.sqlite3") as query:
        assert query("SELECT COUNT(*) FROM jobguard_job") == [(0,)]


@pytest.mark.postgres
@pytest.mark.redis
def test_the_demo_proves_every_guarantee_on_postgresql_and_redis(tmp_path: Path) -> None:
    import psycopg

    database_url = os.environ["JOBGUARD_TEST_DATABASE_URL"]
    url = urlparse(database_url)
    name = url.path.lstrip("/")
    server = url._replace(path="/postgres").geturl()
    with closing(psycopg.connect(server, autocommit=True)) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    project = copy_project(tmp_path)
    env = {"DATABASE_URL": database_url, "REDIS_URL": os.environ["JOBGUARD_TEST_REDIS_URL"]}
    out, summary = run_demo(project, **env)
    assert summary["database"] == "postgresql" and summary["lock_backend"] == "redis"
    with closing(psycopg.connect(database_url, autocommit=True)) as conn:
        query: Query = lambda sql: [tuple(r) for r in conn.execute(sql).fetchall()]  # noqa: E731
        check_against_database(out, summary, query)
        assert "jobguard audit: nothing found" in manage(project, "jobguard_audit", **env)
        approve_in_the_console(project, query, **env)


def test_on_a_terminal_the_demo_draws_live_progress_bars(tmp_path: Path) -> None:
    import pty

    project = copy_project(tmp_path)
    manage(project, "migrate", "--verbosity", "0")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "JOBGUARD_")) and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update(PYTHONPATH=str(ROOT), COLUMNS="120", LINES="40", TERM="xterm-256color")
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "shop_demo", "--orders", "40"],
        cwd=project,
        env=env,
        stdout=follower,
        stderr=subprocess.STDOUT,
    )
    os.close(follower)
    chunks = []
    while True:
        # Not a timing assertion: a guard so a wedged demo fails instead of hanging the suite.
        if not select.select([leader], [], [], 300)[0]:
            proc.kill()
            pytest.fail(
                "the demo printed nothing for 300 s: " + b"".join(chunks).decode("utf-8", "replace")[-3000:]
            )
        try:
            data = os.read(leader, 65536)
        except OSError:  # the terminal closed: the demo has exited
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=300) == 0
    screen = b"".join(chunks).decode("utf-8", "replace")
    # rich's live area: bars per queue (drawn with box characters) redrawn in place.
    assert "\x1b[" in screen and "━" in screen, screen[-3000:]
    assert "fulfilment" in screen and "lock contentions" in screen and "duplicates stopped" in screen
    assert "What the database says" in screen and "approver / approver-demo" in screen


def test_the_shops_own_tests_pass_with_the_test_kit(tmp_path: Path) -> None:
    """example_project/shop/tests.py: plain TestCases through django_jobguard.testing, no worker."""
    project = copy_project(tmp_path)
    output = manage(project, "test", "shop", "--verbosity", "2", both=True)
    assert "Ran 5 tests" in output and "\nOK" in output, output[-4000:]
    for name in (
        "test_a_charge_pays_the_order_and_sends_one_receipt",
        "test_a_declined_card_is_dead_lettered_at_once",
        "test_a_slow_mail_provider_is_retried_until_it_answers",
        "test_a_charge_runs_when_the_order_commits",
        "test_a_rolled_back_order_is_never_charged",
    ):
        assert f"{name} (shop.tests." in output, output[-4000:]
