"""``jobguard_worker`` accepts django-tasks-db's ``db_worker`` flags (real worker processes)."""

from __future__ import annotations

import subprocess

import pytest

from django_jobguard.models import Job
from tests.conftest import ROOT, worker_command, worker_env
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def run_worker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        worker_command(*args),
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def enqueue_on(*queues: str) -> dict[str, int]:
    return {name: tasks.add.using(queue_name=name).enqueue(1).pk for name in queues}


def statuses(ids: dict[str, int]) -> dict[str, str]:
    rows = dict(Job.objects.filter(pk__in=ids.values()).values_list("pk", "status"))
    return {name: rows[pk] for name, pk in ids.items()}


def test_queue_name_takes_a_comma_list_and_batch_drains_then_exits():
    ids = enqueue_on("a", "b", "c")
    done = run_worker("--batch", "--queue-name", "a,b")
    assert done.returncode == 0, done.stderr
    assert statuses(ids) == {"a": "succeeded", "b": "succeeded", "c": "queued"}


def test_star_with_exclude_queues_takes_every_other_queue():
    ids = enqueue_on("a", "b", "c")
    done = run_worker("--batch", "--queue-name", "*", "--exclude-queues", "c")
    assert done.returncode == 0, done.stderr
    assert statuses(ids) == {"a": "succeeded", "b": "succeeded", "c": "queued"}


def test_exclude_queues_alone_applies_to_every_queue():
    ids = enqueue_on("a", "b")
    done = run_worker("--batch", "--exclude-queues", "a", "--interval", "0.1", "--worker-id", "flags")
    assert done.returncode == 0, done.stderr
    assert statuses(ids) == {"a": "queued", "b": "succeeded"}
    assert Job.objects.get(pk=ids["b"]).worker_id == "flags"


def test_max_tasks_stops_after_that_many_claims():
    ids = [tasks.add.enqueue(n).pk for n in range(5)]
    done = run_worker("--batch", "--max-tasks", "2")
    assert done.returncode == 0, done.stderr
    assert Job.objects.filter(pk__in=ids, status="succeeded").count() == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--queue-name", "a,,b"], "--queue-name 'a,,b': each queue name is 1 to 100 characters."),
        (
            ["--queue-name", "a", "--exclude-queues", "a"],
            "--exclude-queues leaves no queue to take jobs from.",
        ),
        (["--interval", "0"], "must be more than 0 seconds"),
        (["--max-tasks", "0"], "must be 1 or more, not 0"),
    ],
)
def test_bad_db_worker_flags_are_refused_with_a_clear_message(args, message):
    done = run_worker("--batch", *args)
    assert done.returncode != 0
    assert message in done.stderr
