"""The database's key columns, for text the claim stores: one over-long limit key never stalls a queue.

A keyed rate's key is stored by the claim as ``r:<task>|<key>`` in the rate table's 255-character
key column. Enqueue refuses a key whose stored form would not fit; a row that holds one anyway
(written by an older release, or by the ORM directly) is leased like any other and
dead-lettered by the worker with its reason, while the other jobs of its queue run.

Runs on SQLite by default and on PostgreSQL or MariaDB with ``JOBGUARD_TEST_DATABASE_URL``.
"""

import json

import pytest
from django.db.models import JSONField, Value

from django_jobguard import InvalidArgumentsError, Limit, Rate, store, task
from django_jobguard.exceptions import InvalidTaskError
from django_jobguard.flow import hot_keys
from django_jobguard.models import DeadLetter, FlowRate, Job
from django_jobguard.registry import registry
from tests.support.dlq import run_burst

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("claims_start_from_the_head"),
]

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


def claim(batch_size=10):
    return store.claim("default", [QUEUE], batch_size, "test-worker", flow=registry.flow_plan())


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


#: ``flow_keys`` values enqueue never writes, as a hand-written row, the ORM or an older
#: release may hold them: none is a JSON array of strings.
UNREADABLE_FLOW_KEYS = {
    "object": {"r": "k"},
    "string": "r:tests.store_contract.test_stored_keys.keyed|p:b",
    "number": 7,
    "null": None,
    "array with a number": ["r:tests.store_contract.test_stored_keys.keyed|p:b", 7],
    "nested array": [["r:tests.store_contract.test_stored_keys.keyed|p:b"]],
}
KEYED = "tests.store_contract.test_stored_keys.keyed"
KEYED_QUEUE = "flow-unreadable"


@pytest.fixture(params=["own limits", "guarded shared limit"])
def keyed_task(request):
    """A task with a keyed rate and a keyed concurrency; with a breaker's shared limit too, which
    takes the claim over three round trips on PostgreSQL instead of its one string."""
    hot_keys.clear()

    def partner_call(partner: str) -> None:
        """Does nothing: the test is about what is stored."""

    shared = {"limit": "flow-dep"} if request.param == "guarded shared limit" else {}
    declared = task(
        name=KEYED,
        queue_name=KEYED_QUEUE,
        rate=Rate("100/s", key="p:{partner}", burst=100),
        concurrency=Limit(5, key="p:{partner}"),
        **shared,
    )(partner_call)
    yield declared
    registry.unregister(declared.name)


@pytest.mark.parametrize("stored", UNREADABLE_FLOW_KEYS.values(), ids=UNREADABLE_FLOW_KEYS.keys())
def test_a_row_whose_flow_keys_are_not_a_list_of_strings_is_dead_lettered_and_the_queue_runs_on(
    keyed_task, stored
):
    before, bad, after = (keyed_task.enqueue(partner) for partner in "abc")
    # Value(..., JSONField()): a JSON null, not SQL NULL.
    Job.objects.filter(pk=bad.pk).update(flow_keys=Value(stored, output_field=JSONField()))
    # Before, PostgreSQL's one-string claim failed on it (jsonb_array_elements_text of a
    # non-array), and the claim in Python on every database: no job of the queue was claimed.
    claimed = store.claim("default", [KEYED_QUEUE], 10, "test-worker", flow=registry.flow_plan())
    assert sorted(job.id for job in claimed) == [before.id, bad.id, after.id]
    marked = {job.id: job.unreadable_flow_keys for job in claimed}
    assert marked[before.id] is None and marked[after.id] is None
    assert json.loads(marked[bad.id]) == stored
    # Running, it still counts under none of its keys and breaks no claim.
    later = keyed_task.enqueue("d")
    again = store.claim("default", [KEYED_QUEUE], 10, "test-worker", flow=registry.flow_plan())
    assert [job.id for job in again] == [later.id]
    # What the console reports of the limits reads it too: counted under its task's keys only.
    running, _ = store.flow_usage("default", registry.flow_plan())
    assert running[f"c:{KEYED}|p:a"] == 1 and f"c:{KEYED}|p:b" not in running

    Job.objects.filter(pk__in=[before.pk, bad.pk, after.pk, later.pk]).update(
        status="queued", attempts=0, lease_token=None, lease_expires_at=None
    )
    assert run_burst() == 0
    statuses = dict(Job.objects.values_list("pk", "status"))
    assert [statuses[job.pk] for job in (before, bad, after, later)] == [
        "succeeded",
        "dead",
        "succeeded",
        "succeeded",
    ]
    letter = DeadLetter.objects.get(job_id=bad.pk)
    assert (letter.reason, letter.category) == ("invalid_payload", "permanent")
    assert letter.error_message.startswith("its flow keys are not a list of strings"), letter.error_message
    assert "it was never run" in letter.error_message
