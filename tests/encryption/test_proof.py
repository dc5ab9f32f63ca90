"""The proof: after a run that puts a canary value in every field encryption covers, a dump of
the job tables holds it 0 times; the same run of a task without ``encrypt`` shows it everywhere.

The dump is ``pg_dump --data-only -t 'jobguard_*'`` on PostgreSQL, and a plain SELECT of every
column of every jobguard table on every database. The run is real: a ``jobguard_worker``
process retries, succeeds, dead-letters and redrives an approved, corrected replay.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from typing import Any

import pytest
from django.db import connection

from django_jobguard import dlq
from django_jobguard.models import DeadLetter
from tests.encryption.support import SUITE_KEY, drain_processes
from tests.support.factories import make_user
from tests.testapp import tasks_encrypted

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

SEALED = "CANARY-7f3a5e1d"
PLAIN = "CANARY-0b9c2e44"

#: Every column the plain run must put the canary in, so that finding it nowhere in the
#: encrypted run means something: each field encryption covers (issue 62).
COVERED = {
    ("jobguard_job", "args"),
    ("jobguard_job", "kwargs"),
    ("jobguard_job", "result"),
    ("jobguard_job", "last_error"),
    ("jobguard_job", "progress"),
    ("jobguard_job", "checkpoints"),
    ("jobguard_job", "attempt_history"),
    ("jobguard_deadletter", "args"),
    ("jobguard_deadletter", "kwargs"),
    ("jobguard_deadletter", "error_message"),
    ("jobguard_deadletter", "traceback"),
    ("jobguard_deadletter", "replay_args"),
    ("jobguard_deadletter", "replay_kwargs"),
    ("jobguard_replayevent", "data"),
    ("jobguard_idempotencykey", "result"),
}


def run_everything(workers: Any, task: Any, canary: str) -> None:
    """A retried success with a key, a dead letter, and its corrected replay: every field written."""
    task.using(idempotency_key=f"proof-{task.name}").enqueue(canary, mode="retry_once", note={"memo": canary})
    dead = task.enqueue(f"{canary}-dead", mode="fail", note={"memo": canary})
    drain_processes(workers, SUITE_KEY)
    letter = DeadLetter.objects.get(job=dead)
    dlq.request_replay(
        letter,
        make_user(f"req-{task.name}", "request_replay", "view_payload"),
        "corrected",
        args=[f"{canary}-fixed"],
        kwargs={"mode": "ok", "note": {"memo": canary}},
    )
    letter.refresh_from_db()
    approver = make_user(f"app-{task.name}", "approve_replay", "view_payload")
    dlq.approve_replay(letter, approver, "reviewed", reviewed=dlq.correction_digest(letter))
    drain_processes(workers, SUITE_KEY)
    letter.refresh_from_db()
    assert letter.replay_job is not None and letter.replay_job.status == "succeeded"


def columns_holding(text: str) -> set[tuple[str, str]]:
    """(table, column) of every jobguard column whose value, as text, contains ``text``."""
    found = set()
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        for table in sorted(t for t in connection.introspection.table_names() if t.startswith("jobguard_")):
            cursor.execute(f"SELECT * FROM {quote(table)}")
            names = [column[0] for column in cursor.description]
            for row in cursor.fetchall():
                for name, value in zip(names, row, strict=True):
                    if value is not None and text in str(value):
                        found.add((table, name))
    return found


def pg_dump() -> str:
    binary = shutil.which("pg_dump") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_dump"))), None
    )
    assert binary, "pg_dump is not installed"
    db = connection.settings_dict
    env = {**os.environ, "PGPASSWORD": db.get("PASSWORD") or ""}
    command = [binary, "--data-only", "-t", "jobguard_*", "-h", db["HOST"] or "127.0.0.1"]
    command += ["-p", str(db["PORT"] or 5432), "-U", db["USER"] or "postgres", db["NAME"]]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "COPY public.jobguard_job " in done.stdout
    return done.stdout


def test_no_canary_of_an_encrypted_run_is_left_in_the_job_tables_and_a_plain_run_shows_it(workers):
    run_everything(workers, tasks_encrypted.stash_plain, PLAIN)
    run_everything(workers, tasks_encrypted.stash, SEALED)

    # The control: the same run in clear leaves its canary in every field the proof covers,
    # so the test would fail if encryption missed one.
    assert columns_holding(PLAIN) >= COVERED, COVERED - columns_holding(PLAIN)
    assert columns_holding(SEALED) == set()
    if connection.vendor == "postgresql":
        dump = pg_dump()
        assert dump.count(PLAIN) > len(COVERED)
        assert dump.count(SEALED) == 0
