"""Workflows of encrypting tasks: results handed on between steps stay encrypted, and arrive in clear.

A chain step's result is stored sealed and handed to the next step as an argument; a group's
callback takes its members' results. Run by a worker in this process.
"""

from __future__ import annotations

import pytest

from django_jobguard import chain, group
from django_jobguard.models import Job, Workflow
from tests.encryption.support import assert_sealed, drain, stored
from tests.testapp import tasks, tasks_encrypted, tasks_results

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_chain_hands_a_sealed_result_on_to_the_next_step_in_clear_and_keeps_it_sealed():
    wf = chain(tasks_encrypted.echo.s("secret-step"), tasks_encrypted.echo.s().receives()).enqueue()
    drain()
    first, second = (Job.objects.get(pk=job.pk) for job in wf.jobs)
    assert_sealed(stored(first.pk, "result")["result"])
    assert_sealed(stored(second.pk, "args")["args"])
    assert second.wait(timeout=5) == "secret-step"
    assert "secret-step" not in str(stored(second.pk, "args", "result"))


def test_a_plain_step_after_an_encrypted_one_gets_its_argument_sealed():
    wf = chain(tasks_encrypted.echo.s(4), tasks.add.s(10).receives()).enqueue()
    drain()
    _, added = wf.jobs
    assert_sealed(stored(added.pk, "args")["args"])
    assert Job.objects.get(pk=added.pk).wait(timeout=5) == 14


def test_a_group_callback_takes_encrypted_members_results_in_clear_and_stores_them_sealed():
    wf = group(
        [tasks_encrypted.echo.s("m-1"), tasks_encrypted.echo.s("m-2")],
        then=tasks_results.collect.s("cb").receives_results("results"),
    ).enqueue()
    drain()
    workflow = Workflow.objects.get(pk=wf.id)
    members = set(Job.objects.filter(workflow_id=workflow.pk).values_list("pk", flat=True))
    callback = Job.objects.exclude(pk__in=members).get(task_name=tasks_results.collect.name)
    assert callback.wait(timeout=5) == {"label": "cb", "results": ["m-1", "m-2"], "progress": None}
    assert "m-1" not in str(stored(callback.pk, "args", "kwargs", "result"))


def test_a_callback_of_an_encrypting_task_keeps_its_own_arguments_sealed_in_the_workflow():
    wf = group([tasks.add.s(1, 2)], then=tasks_encrypted.echo.s("callback-secret")).enqueue()
    assert "callback-secret" not in str(
        Workflow.objects.filter(pk=wf.id).values_list("callbacks", flat=True)[0]
    )
    drain()
    members = set(Job.objects.filter(workflow_id=wf.id).values_list("pk", flat=True))
    callback = Job.objects.exclude(pk__in=members).get(task_name=tasks_encrypted.echo.name)
    assert callback.wait(timeout=5) == "callback-secret"
