"""The store contract, for text the claim stores: one job's over-long limit key never stalls a queue.

A keyed rate's key is stored by the claim as ``r:<task>|<key>`` in the rate table's 255-character
key column. Enqueue refuses a key whose stored form would not fit; a row that holds one anyway
(written by an older release, or by the ORM directly) is leased like any other and
dead-lettered by the worker with its reason, while the other jobs of its queue run.

Runs on SQLite by default and on PostgreSQL or MariaDB with ``JOBGUARD_TEST_DATABASE_URL``.
"""

import pytest

from django_jobguard import InvalidArgumentsError, Rate, store, task
from django_jobguard.exceptions import InvalidTaskError
from django_jobguard.models import DeadLetter, FlowRate, Job
from django_jobguard.registry import registry
from django_jobguard.store._flow import hot_keys
from tests.support.dlq import run_burst

pytestmark = [pytest.mark.django_db(transaction=True)]

#: 60 characters: with ``r:`` and ``|`` a 200-character key (the per-key limit) is 263 stored.
LONG_NAME = "tests.store_contract.test_stored_keys." + "x" * 22
QUEUE = "flow-long"


@pytest.fixture
def long_task():
    """A rate-limited task with a long name, registered for the test."""
    hot_keys.clear()

    def partner_call(partner: str) -> None:
        """Does nothing: the test is about what is stored."""

    declared = task(name=LONG_NAME, queue_name=QUEUE, rate=Rate("100/s", key="p:{partner}", burst=100))(
        partner_call
    )
    yield declared
    registry.unregister(declared.name)


def claim(limit=10):
    return store.claim("default", [QUEUE], limit, "test-worker", flow=store.flow_plan())


def test_enqueue_refuses_a_rate_key_whose_stored_form_would_not_fit(long_task):
    fits = 255 - len(f"r:{LONG_NAME}|") - len("p:")
    job = long_task.enqueue("a" * fits)  # the longest that fits is stored intact
    assert Job.objects.get(pk=job.pk).flow_keys == [f"r:{LONG_NAME}|p:{'a' * fits}"]
    with pytest.raises(InvalidArgumentsError, match=r"rate key of .* must have 1 to 192 characters"):
        long_task.enqueue("a" * (fits + 1))
    assert Job.objects.count() == 1
    assert [claimed.id for claimed in claim()] == [job.id]
    assert FlowRate.objects.filter(key=f"r:{LONG_NAME}|p:{'a' * fits}").exists()


def test_a_stored_over_long_key_is_dead_lettered_and_the_queue_runs_on(long_task):
    before = long_task.enqueue("a")
    bad = long_task.enqueue("b")
    after = long_task.enqueue("c")
    # As an older release stored it (its limit was the key's 200, not the stored form's 255).
    over_long = f"r:{LONG_NAME}|p:{'b' * 198}"
    Job.objects.filter(pk=bad.pk).update(args=["b" * 198], flow_keys=[over_long])
    assert sorted(job.id for job in claim()) == [before.id, bad.id, after.id]
    assert not FlowRate.objects.filter(key=over_long).exists()
    Job.objects.filter(pk__in=[before.pk, bad.pk, after.pk]).update(
        status="queued", attempts=0, lease_token=None, lease_expires_at=None
    )
    run_burst()
    statuses = dict(Job.objects.values_list("pk", "status"))
    assert (statuses[before.pk], statuses[bad.pk], statuses[after.pk]) == ("succeeded", "dead", "succeeded")
    letter = DeadLetter.objects.get(job_id=bad.pk)
    assert (letter.reason, letter.category) == ("invalid_payload", "permanent")
    assert "its rate cannot be kept, so it was never run" in letter.error_message
    assert "gave a key of 200 characters" in letter.error_message


def test_a_task_whose_stored_rate_keys_could_never_fit_is_refused_at_declaration():
    def noop(partner: str) -> None:
        """Declared only at the longest names that fit."""

    # r:<task>|<key> with a key of one character, rate:task:<task>: each at most 255.
    with pytest.raises(InvalidTaskError, match="at most 251 characters, not 252"):
        task(name="k" * 252, rate=Rate("1/s", key="{partner}"))(noop)
    with pytest.raises(InvalidTaskError, match="at most 245 characters, not 246"):
        task(name="u" * 246, rate="1/s")(noop)
    assert registry.find("k" * 252) is None and registry.find("u" * 246) is None
    for declared in (
        task(name="k" * 251, rate=Rate("1/s", key="{partner}"))(noop),
        task(name="u" * 245, rate="1/s")(noop),
    ):
        registry.unregister(declared.name)
