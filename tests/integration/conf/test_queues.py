"""Undeclared queues: refused by enqueue (test_enqueue.py), the worker's --queue, jobguard_status
--queue and a system check, once JOBGUARD["QUEUES"] declares queues."""

import io
import subprocess

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_jobguard import checks
from django_jobguard.models import Job
from tests.conftest import worker_command, worker_env
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)  # the worker runs in threads

REFUSED = (
    "--queue 'typo': queue 'typo' is not declared in JOBGUARD['QUEUES']; known queues: default, "
    "jobguard.cache, slow. "
    "Check the spelling, declare it there, or set JOBGUARD['ALLOW_UNDECLARED_QUEUES'] = True to allow "
    "free-form queue names. No job is in that queue either."
)


def strict(**changes):
    return override_settings(JOBGUARD={**settings.JOBGUARD, "ALLOW_UNDECLARED_QUEUES": False, **changes})


@pytest.mark.parametrize("command", ["jobguard_worker", "jobguard_status"])
def test_a_command_refuses_an_undeclared_queue_naming_the_known_ones(command):
    extra = ["--burst"] if command == "jobguard_worker" else []
    with strict(), pytest.raises(CommandError) as refused:
        call_command(command, "--queue", "default", "--queue", "typo", *extra, stdout=io.StringIO())
    assert str(refused.value) == REFUSED


def test_jobguard_status_short_option_refuses_too():
    with strict(), pytest.raises(CommandError, match=r"^--queue 'typo': queue 'typo' is not declared"):
        call_command("jobguard_status", "-q", "typo", stdout=io.StringIO())


def test_an_undeclared_queue_that_still_holds_jobs_can_be_drained_and_shown():
    job = tasks.add.using(queue_name="retired").enqueue(1)  # enqueued while it was allowed
    with strict():
        out = io.StringIO()
        call_command("jobguard_status", "-q", "retired", "--json", stdout=out)
        assert '"queue": "retired"' in out.getvalue()
        call_command("jobguard_worker", "--queue", "retired", "--burst", stdout=io.StringIO())
    job.refresh_from_db()
    assert job.status == "succeeded"


def test_declared_and_default_queues_are_accepted_by_the_commands():
    with strict(QUEUES={"slow": {}}):
        out = io.StringIO()
        call_command("jobguard_status", "-q", "default", "-q", "slow", stdout=out)
        assert "default" in out.getvalue() and "slow" in out.getvalue()
        call_command("jobguard_worker", "--queue", "default", "--queue", "slow", "--burst")


@pytest.mark.processes
def test_the_worker_process_exits_non_zero_on_an_undeclared_queue():
    done = subprocess.run(
        worker_command("--queue", "typo", "--burst"),
        env=worker_env(JOBGUARD_TEST_STRICT_QUEUES="1"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "CommandError: --queue 'typo': queue 'typo' is not declared in JOBGUARD['QUEUES']" in done.stderr
    assert not Job.objects.exists()


def test_the_system_check_reports_a_task_whose_queue_is_not_declared():
    with strict():
        messages = {m.msg: m for m in checks.tasks.check_task_queues() if m.id == "jobguard.E030"}
    context = (
        "Task tests.testapp.tasks.describe_context names queue 'context', which JOBGUARD['QUEUES'] "
        "does not declare; its enqueues are refused."
    )
    assert context in messages
    assert "known queues: default, jobguard.cache, slow" in messages[context].hint
    assert not any("tests.testapp.tasks.slow_record " in msg for msg in messages)  # "slow" is declared
    with strict(ALLOW_UNDECLARED_QUEUES=True):
        assert checks.tasks.check_task_queues() == []
    with strict(QUEUES={}):
        assert checks.tasks.check_task_queues() == []
