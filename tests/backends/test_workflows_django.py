"""Tasks declared with Django's ``@task`` take part in chains and batches (on a JobGuardBackend)."""

from __future__ import annotations

import pytest
from django.conf import settings

if not getattr(settings, "TASKS_ROOT", None):
    pytest.skip(
        "neither django.tasks (Django 6.0+) nor the django-tasks backport is importable; "
        'on Django 5.2: pip install "django-jobguard[backport]"',
        allow_module_level=True,
    )

from django.test import override_settings

from django_jobguard import Batch, InvalidArgumentsError, chain
from django_jobguard.backends import step
from django_jobguard.models import Job, Workflow
from tests.support.dlq import run_burst
from tests.testapp import tasks, tasks_django

pytestmark = [
    pytest.mark.django_db(transaction=True),
]


def drain() -> None:
    for _ in range(10):
        run_burst()
        if not Job.objects.filter(status__in=["queued", "running"]).exists():
            return
    pytest.fail("jobs still queued after draining")


def test_a_chain_of_django_tasks_passes_results_on():
    wf = chain(step(tasks_django.add, 1, 2), step(tasks_django.add, 10).receives("b")).enqueue()
    drain()
    first, second = (Job.objects.get(pk=job.pk) for job in wf.jobs)
    assert (first.status, first.result) == ("succeeded", 3)
    assert (second.status, second.result, second.kwargs) == ("succeeded", 13, {"b": 3})


def test_a_batch_mixes_django_and_jobguard_tasks_with_a_django_callback():
    batch = Batch(on_complete=step(tasks_django.add, 100, 1)).enqueue(
        [step(tasks_django.add, i, i) for i in range(3)] + [tasks.add.s(5)]
    )
    drain()
    p = batch.progress()
    assert (p.state, p.total, p.succeeded) == ("finished", 4, 4)
    callback = Job.objects.get(task_name=tasks_django.add.module_path, args=[100, 1])
    assert (callback.status, callback.result) == ("succeeded", 101)


@override_settings(
    TASKS={
        **settings.TASKS,
        "elsewhere": {"BACKEND": f"{settings.TASKS_ROOT}.backends.immediate.ImmediateBackend"},
    }
)
def test_a_task_of_another_backend_is_refused_and_nothing_written():
    other = tasks_django.add.using(backend="elsewhere")
    refused = r"runs on the tasks backend 'elsewhere' \(ImmediateBackend\)"
    with pytest.raises(InvalidArgumentsError, match=refused):
        chain(step(tasks_django.add, 1, 2), step(other, 1, 2)).enqueue()
    with pytest.raises(InvalidArgumentsError, match=r"Arguments do not fit"):
        step(tasks_django.add, 1, 2, 3)
    assert not Job.objects.exists()
    assert not Workflow.objects.exists()
