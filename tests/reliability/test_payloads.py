"""Payloads that no longer decode into a call reach the dead-letter queue (any database).

Found by T8: a job whose stored ``args`` was a bare JSON string ran with the string's
characters as its arguments.
"""

import pytest

from django_jobguard.models import DeadLetter, Job
from django_jobguard.worker import Worker
from tests.testapp import tasks_faults

pytestmark = pytest.mark.reliability


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("field", "value"), [("args", "1"), ("args", {"value": 1}), ("kwargs", [1]), ("args", 42)]
)
def test_stored_arguments_of_the_wrong_json_type_are_dead_lettered_not_unpacked(field, value):
    job = tasks_faults.takes_one.enqueue(1)
    Job.objects.filter(pk=job.pk).update(**{field: value})
    Worker(queues=[tasks_faults.QUEUE], burst=True, install_signal_handlers=False).run()
    job.refresh_from_db()
    letter = DeadLetter.objects.get(job=job)
    assert (job.status, job.attempts, letter.reason) == ("dead", 1, "invalid_payload")
    assert "are not a JSON list and object" in letter.error_message
