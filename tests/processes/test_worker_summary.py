"""What a worker says when it exits: ``jobguard_worker --burst`` prints a one-line summary."""

import re

import pytest

from tests.testapp import tasks, tasks_dlq

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def test_a_burst_prints_what_it_did_on_stdout_at_the_default_log_level(workers):
    tasks.add.enqueue(1, b=2)  # succeeds
    tasks_dlq.rate_limited.enqueue("summary", retry_after=600)  # retried, not due again in this burst
    tasks.flaky.enqueue("summary", failures=5, error="invalid_order")  # permanent: dead-lettered
    done = workers.burst()  # logging stays at WARNING, the default
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1, lines
    assert re.fullmatch(
        r"jobguard_worker --burst: jobs=3 succeeded=1 retried=1 dead_lettered=1 put_back=0 "
        r"elapsed=\d+\.\d\ds",
        lines[0],
    ), lines


def test_a_burst_with_nothing_due_says_so(workers):
    done = workers.burst()
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().startswith(
        "jobguard_worker --burst: jobs=0 succeeded=0 retried=0 dead_lettered=0"
    )
