"""``JOBGUARD["STORE"] = "memory"``: enqueue and run jobs in a test that has no database.

Each test here is a ``SimpleTestCase`` (no database: a query fails it), so each proves that
the path it runs, from ``Task.enqueue()`` through the worker's pipeline to the ack, the retry
or the dead letter, goes through the store alone. The refusal outside tests runs in a process
of its own, where Django's test environment is not set up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import SimpleTestCase, override_settings

from django_jobguard import chain, store
from django_jobguard.checks.settings import check_memory_store
from django_jobguard.conf import parse
from django_jobguard.outcome import HeldState
from django_jobguard.store.memory import MemoryStore
from django_jobguard.task import task
from django_jobguard.worker import pipeline
from django_jobguard.worker.completer import Completer
from django_jobguard.worker.held import Held
from tests.testapp import tasks

ROOT = Path(__file__).resolve().parents[2]
MEMORY = {**settings.JOBGUARD, "STORE": "memory"}


@task(name="tests.unit.memory_setting.always_fails", max_attempts=2, retry={"base": 0, "max": 0, "jitter": 0})
def always_fails(order_id: int) -> None:
    raise ValueError(f"order {order_id}: the provider said no")


@task(name="tests.unit.memory_setting.charge", idempotency_key="charge:{order_id}")
def charge(order_id: int) -> int:
    return order_id * 100


@task(name="tests.unit.memory_setting.locked", lock="res:{resource}", takes_context=True)
def locked(context: Any, resource: str) -> int | None:
    return context.fencing_token


@task(name="tests.unit.memory_setting.steps", takes_context=True)
def steps(context: Any) -> list[str]:
    context.checkpoint("charged", {"id": 7})
    return sorted(context.checkpoints)


def run_due() -> list[str]:
    """Claim what is due and run each job through the worker's pipeline, as one executor would."""
    completer = Completer("default", "memory-test")
    runtime = pipeline.Runtime("default", "memory-test", completer)
    outcomes = []
    for job in store.claim("default", None, 100, "memory-test"):
        now = time.monotonic()
        held = Held(job=job, renewed_at=now, state=HeldState.RUNNING, started_at=now)
        outcome = pipeline.run(held, runtime)
        completer.settle(held, outcome)
        outcomes.append(type(outcome).__name__)
    return outcomes


@override_settings(JOBGUARD=MEMORY)
class MemoryStoreSettingTests(SimpleTestCase):
    def setUp(self) -> None:
        memory = store.memory_store()
        assert isinstance(memory, MemoryStore)
        memory.clear()
        self.memory = memory

    def test_enqueue_and_run_a_job_with_no_database(self) -> None:
        job = tasks.add.enqueue(2, b=3)
        assert self.memory.jobs[job.pk].status == "queued"
        assert (job.task_name, job.args, job.kwargs, job.status) == (tasks.add.name, [2], {"b": 3}, "queued")
        assert run_due() == ["Succeeded"]
        stored = self.memory.jobs[job.pk]
        assert (stored.status, stored.result, stored.attempts) == ("succeeded", 5, 1)
        assert run_due() == []

    def test_a_failing_job_is_retried_then_dead_lettered_in_the_store(self) -> None:
        job = always_fails.enqueue(7)
        assert run_due() == ["Retry"]
        assert self.memory.jobs[job.pk].status == "queued"
        assert run_due() == ["Dead"]
        (letter,) = self.memory.dead_letters
        assert (letter.job_id, letter.reason, letter.attempts) == (job.pk, "retries_exhausted", 2)
        assert "the provider said no" in letter.error_message
        assert self.memory.jobs[job.pk].status == "dead"

    def test_a_keyed_action_is_enqueued_and_run_once(self) -> None:
        first = charge.enqueue(4)
        assert charge.enqueue(4).pk == first.pk
        assert run_due() == ["Succeeded"]
        assert charge.enqueue(4).pk == first.pk  # the action succeeded: still the same job
        (((_, key), row),) = self.memory.keys.items()
        assert (key, row.status, row.result, row.duplicates) == ("charge:4", "succeeded", 400, 2)
        assert len(self.memory.jobs) == 1

    def test_a_locked_task_takes_and_releases_its_lock_in_the_store(self) -> None:
        locked.enqueue("printer")
        assert run_due() == ["Succeeded"]
        ((name, row),) = self.memory.locks.items()
        assert name.endswith("res:printer") and row.token is None  # taken, then released
        (job,) = self.memory.jobs.values()
        assert job.result == row.fencing_token  # the handler ran holding it

    def test_checkpoints_are_kept_in_the_store(self) -> None:
        job = steps.enqueue()
        assert run_due() == ["Succeeded"]
        stored = self.memory.jobs[job.pk]
        assert (stored.result, stored.checkpoints) == (["charged"], {"charged": {"id": 7}})

    def test_workflows_say_they_need_the_database(self) -> None:
        with self.assertRaisesMessage(
            ImproperlyConfigured, "Workflows (chain, group, Batch, after=) need the"
        ):
            chain(tasks.add.s(1), tasks.add.s(2)).enqueue()
        first = tasks.add.enqueue(1)
        with self.assertRaisesMessage(ImproperlyConfigured, "need the database store"):
            tasks.add.using(after=[first]).enqueue(2)
        assert list(self.memory.jobs) == [first.pk]  # nothing else was written

    def test_the_check_passes_under_tests(self) -> None:
        assert check_memory_store() == []


class MemoryStoreSettingValueTests(SimpleTestCase):
    def test_an_unknown_store_is_refused_naming_the_key(self) -> None:
        with self.assertRaisesMessage(ImproperlyConfigured, "JOBGUARD['STORE']"):
            parse({"STORE": "disk"})

    def test_the_database_store_is_the_default(self) -> None:
        assert parse({}).store == "database"
        assert store.memory_store() is None

    def test_a_change_of_the_setting_changes_the_store(self) -> None:
        assert store.memory_store() is None  # the database's dialect, looked up and kept
        with override_settings(JOBGUARD=MEMORY):
            memory = store.memory_store()
            assert isinstance(memory, MemoryStore)
        assert store.memory_store() is None
        with override_settings(JOBGUARD=MEMORY):
            assert store.memory_store() is memory  # one per alias for the process

    def test_a_substitute_outlives_a_change_of_the_setting(self) -> None:
        own = MemoryStore()
        with store.substitute("default", own), override_settings(JOBGUARD=MEMORY):
            assert store.memory_store() is own
        assert store.memory_store() is None


_OUTSIDE_TESTS = """
import json, django
from django.conf import settings
from tests import settings as base
names = {name: getattr(base, name) for name in dir(base) if name.isupper()}
names["JOBGUARD"] = {**base.JOBGUARD, "STORE": "memory"}
names["DEBUG"] = False
settings.configure(**names)
django.setup()
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from tests.testapp import tasks
ids = [message.id for message in run_checks() if message.id == "jobguard.E059"]
try:
    tasks.add.enqueue(1)
    refused = ""
except ImproperlyConfigured as exc:
    refused = str(exc)
print(json.dumps({"ids": ids, "refused": refused}))
"""


class MemoryStoreOutsideTestsTests(SimpleTestCase):
    def test_a_process_that_is_not_running_tests_refuses_the_memory_store(self) -> None:
        env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
        done = subprocess.run(
            [sys.executable, "-c", _OUTSIDE_TESTS],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout.strip().splitlines()[-1])
        assert found["ids"] == ["jobguard.E059"]
        assert "JOBGUARD['STORE'] is 'memory', which is for tests" in found["refused"]
