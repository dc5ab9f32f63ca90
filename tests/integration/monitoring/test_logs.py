"""Structured logs: every record about a job carries the same fields (Worker run in-process)."""

from __future__ import annotations

import datetime
import importlib.util
import json
import logging
import logging.config
import time
from pathlib import Path

import pytest
from django.utils import timezone

from django_jobguard import lock
from django_jobguard.log import JOB_LOG_FIELDS, OUTCOMES, TextFormatter, escape_controls
from django_jobguard.models import Job
from django_jobguard.worker import Worker
from tests.support.factories import make_superuser
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

WORKER_ID = "obs-log-worker"
ADD = "tests.testapp.tasks.add"


def burst_until_done(job_ids: list[int], rounds: int = 100) -> None:
    """Burst again while retries wait out their (short) backoff."""
    for _ in range(rounds):
        Worker(burst=True, install_signal_handlers=False, worker_id=WORKER_ID, poll_interval=0.05).run()
        if not Job.objects.filter(pk__in=job_ids, status__in=("queued", "running")).exists():
            return
        time.sleep(0.05)
    pytest.fail("jobs still queued after the bursts")


def job_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("django_jobguard") and "job_id=" in r.getMessage()]


def only(records: list[logging.LogRecord], message: str, job_id: int) -> logging.LogRecord:
    found = [r for r in records if r.getMessage().startswith(message) and r.job_id == job_id]
    assert len(found) == 1, [r.getMessage() for r in records]
    return found[0]


def test_every_job_record_carries_every_structured_field(caplog):
    caplog.set_level(logging.INFO, logger="django_jobguard")
    now = timezone.now()
    # A lock contention first: the test holds the job's lock for one burst.
    held = lock("res:obs-logs", ttl=60)
    assert held.acquire(blocking=False)
    locked = tasks.locked_interval.using(idempotency_key="obs-logs-key").enqueue("obs-logs")
    Worker(burst=True, install_signal_handlers=False, worker_id=WORKER_ID, poll_interval=0.05).run()
    held.release()
    Job.objects.filter(pk=locked.pk).update(run_after=now)

    retried = tasks.flaky.enqueue("obs-logs-retry", failures=1)
    dead = tasks.flaky.enqueue("obs-logs-dead", failures=9, error="permanent")
    orphan_fields = {
        "task_name": ADD,
        "queue_name": "default",
        "args": [1],
        "status": "running",
        "lease_token": "0" * 32,
        "lease_expires_at": now - datetime.timedelta(seconds=5),
        "idempotency_key": "obs-orphan",
        "lock_key": "",
    }
    reappearing = Job.objects.create(attempts=1, max_attempts=3, **orphan_fields)
    exhausted = Job.objects.create(attempts=3, max_attempts=3, **{**orphan_fields, "idempotency_key": None})
    burst_until_done([locked.pk, retried.pk, dead.pk, reappearing.pk, exhausted.pk])
    duplicate = Job.objects.create(
        task_name=locked.task_name,
        args=locked.args,
        kwargs=locked.kwargs,
        idempotency_key="obs-logs-key",
        lock_key=locked.lock_key,
    )
    burst_until_done([duplicate.pk])

    records = job_records(caplog)
    assert len(records) >= 8
    for record in records:
        missing = [field for field in JOB_LOG_FIELDS if not hasattr(record, field)]
        assert not missing, f"{record.getMessage()!r} lacks {missing}"
        assert record.outcome in OUTCOMES, record.getMessage()
        assert record.worker_id == WORKER_ID

    contended = only(records, "lock_contended", locked.pk)
    assert (contended.outcome, contended.lock_key, contended.resource_id) == (
        "lock_contended",
        "res:obs-logs",
        "res:obs-logs",
    )
    ok = only(records, "job_succeeded", locked.pk)
    assert {field: getattr(ok, field) for field in JOB_LOG_FIELDS if field != "duration"} == {
        "job_id": locked.pk,
        "job_type": "tests.testapp.tasks.locked_interval",
        "queue": "default",
        "attempt": 1,  # the contention gave its attempt back
        "idempotency_key": "obs-logs-key",
        "lock_key": "res:obs-logs",
        "resource_id": "res:obs-logs",
        "worker_id": WORKER_ID,
        "outcome": "succeeded",
    }
    assert isinstance(ok.duration, float) and ok.duration > 0

    retry = only(records, "job_retry", retried.pk)
    assert (retry.outcome, retry.attempt, retry.lock_key) == ("retry", 1, None)
    assert retry.duration > 0
    assert only(records, "job_succeeded", retried.pk).attempt == 2

    failed = only(records, "job_dead_lettered", dead.pk)
    assert (failed.outcome, failed.job_type) == ("dead", "tests.testapp.tasks.flaky")
    assert failed.duration > 0

    back = only(records, "lease_expired", reappearing.pk)
    assert (back.outcome, back.job_type, back.idempotency_key, back.attempt) == (
        "reappeared",
        ADD,
        "obs-orphan",
        1,
    )
    reaped = only(records, "job_dead_lettered", exhausted.pk)
    assert (reaped.outcome, reaped.job_type, reaped.attempt, reaped.duration) == ("dead", ADD, 3, None)

    dup = only(records, "job_duplicate", duplicate.pk)
    assert (dup.outcome, dup.idempotency_key) == ("duplicate", "obs-logs-key")


def example_json_formatter() -> logging.Formatter:
    """The JSON formatter exactly as the example project's LOGGING setting configures it."""
    path = Path(__file__).resolve().parents[3] / "example_project" / "example" / "settings.py"
    spec = importlib.util.spec_from_file_location("example_settings", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.LOGGING
    assert config["handlers"]["console"]["formatter"] == "json"
    formatter = logging.config.DictConfigurator(config).configure_formatter(config["formatters"]["json"])
    assert type(formatter).__module__.startswith("pythonjsonlogger")
    return formatter


def test_the_example_projects_json_formatter_turns_the_fields_into_keys(caplog):
    caplog.set_level(logging.INFO, logger="django_jobguard")
    job = tasks.add.using(idempotency_key="obs-json").enqueue(2, b=3)
    burst_until_done([job.pk])
    record = only(job_records(caplog), "job_succeeded", job.pk)
    document = json.loads(example_json_formatter().format(record))
    assert document["message"].startswith(f"job_succeeded job_id={job.pk} ")
    assert document["levelname"] == "INFO"
    assert {key: document[key] for key in ("job_id", "job_type", "queue", "attempt", "idempotency_key")} == {
        "job_id": job.pk,
        "job_type": ADD,
        "queue": "default",
        "attempt": 1,
        "idempotency_key": "obs-json",
    }
    assert document["outcome"] == "succeeded" and document["lock_key"] is None
    assert document["duration"] > 0


FORGED = "\nERROR django_jobguard.worker job_succeeded job_id=1 forged"


def test_the_text_formatter_writes_each_record_on_one_line_whatever_users_put_in_fields(caplog):
    """A newline in a task name, a key or an error started a forged line under a plain formatter."""
    caplog.set_level(logging.INFO, logger="django_jobguard")
    keyed = tasks.add.using(idempotency_key=f"key{FORGED}").enqueue(1)
    unknown = Job.objects.create(task_name=f"shop.tasks.nope{FORGED}", args=[], kwargs={})
    burst_until_done([keyed.pk, unknown.pk])
    duplicate = Job.objects.create(task_name=ADD, args=[1], kwargs={}, idempotency_key=keyed.idempotency_key)
    burst_until_done([duplicate.pk])
    try:
        raise ValueError(f"could not parse\r{FORGED}\x1b[2K")
    except ValueError:
        logging.getLogger("django_jobguard.worker").exception("job_crashed job_id=%s", 0)

    formatter = TextFormatter("%(levelname)s %(name)s %(message)s idempotency_key=%(idempotency_key)s")
    records = [r for r in caplog.records if r.name.startswith("django_jobguard")]
    about_fields = [r for r in records if hasattr(r, "idempotency_key")]
    assert any("nope\\n" in r.getMessage() for r in records)  # the unknown task's record, as %r
    assert any(r.idempotency_key == keyed.idempotency_key for r in about_fields)
    for record in about_fields:
        line = formatter.format(record)
        assert "\n" not in line and "\r" not in line, line
    crash = TextFormatter("%(levelname)s %(message)s").format(records[-1])
    assert "\n" not in crash and "\r" not in crash and "\x1b" not in crash
    assert crash.startswith("ERROR job_crashed job_id=0\\nTraceback")
    assert "could not parse\\r\\nERROR django_jobguard.worker job_succeeded job_id=1 forged\\x1b[2K" in crash
    # The plain logging.Formatter, for contrast, lets a traceback's forged line start its own line.
    assert any(
        line.startswith("ERROR django_jobguard.worker job_succeeded")
        for record in records
        for line in logging.Formatter("%(message)s").format(record).splitlines()
    )


def test_a_plain_formatter_keeps_each_user_value_inside_its_records_line(caplog):
    """Without TextFormatter, a newline in a key, a reason, a user name or a row's task name
    stays inside the record's line: user-supplied values are logged with %r, escaped."""
    from django_jobguard import breakers
    from django_jobguard.locks import release
    from django_jobguard.operations import jobs as job_ops
    from django_jobguard.operations import queues

    caplog.set_level(logging.DEBUG, logger="django_jobguard")
    person = make_superuser(f"root{FORGED}")
    unknown = Job.objects.create(task_name=f"shop.tasks.nope{FORGED}", args=[], kwargs={})
    keyed = tasks.add.using(idempotency_key=f"key{FORGED}").enqueue(1)
    tasks.add.using(idempotency_key=f"key{FORGED}").enqueue(1)  # a duplicate of the waiting job
    waiting = tasks.add.enqueue(2)
    job_ops.cancel([waiting.pk], reason=f"why{FORGED}")
    queues.pause("default", user=person, reason=f"maintenance{FORGED}")
    queues.resume("default", user=person)
    breakers.open_breaker("flow-dep", actor=f"ops{FORGED}", reason=f"incident{FORGED}")
    breakers.close("flow-dep", actor="ops")
    handle = lock(f"order:1{FORGED}", ttl=600, backend="database")
    assert handle.acquire(blocking=False)
    release.force_release(handle.name, user=person, reason=f"stuck{FORGED}")
    burst_until_done([unknown.pk, keyed.pk])

    plain = logging.Formatter("%(levelname)s %(name)s %(message)s")
    records = [r for r in caplog.records if r.name.startswith("django_jobguard")]
    lines = {r.getMessage().split()[0]: plain.format(r) for r in records if not r.exc_info}
    for event in (
        "job_dead_lettered",
        "idempotency_duplicate",
        "jobs_cancelled",
        "queue_paused",
        "queue_resumed",
        "breaker_open",
        "lock_force_released",
    ):
        assert event in lines, sorted(lines)
        assert "\n" not in lines[event] and "\\nERROR django_jobguard.worker" in lines[event], lines[event]
    # Every record's own message (a traceback aside: TextFormatter escapes those) is one line.
    assert [r.getMessage() for r in records if "\n" in r.getMessage()] == []


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("a\nb\r\nc", "a\\nb\\r\\nc"),
        ("tab\there", "tab\\there"),
        ("\x1b[31mred\x00", "\\x1b[31mred\\x00"),
        ("line\u2028sep\x85", "line\\u2028sep\\x85"),
        ("naïve 日本語 \\n", "naïve 日本語 \\n"),
    ],
)
def test_escape_controls_keeps_printable_text_and_escapes_the_rest(text, escaped):
    assert escape_controls(text) == escaped
