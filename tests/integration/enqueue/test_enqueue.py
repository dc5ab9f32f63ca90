import datetime

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_jobguard import IdempotencyConflict, InvalidArgumentsError, dlq, lock
from django_jobguard.exceptions import UnknownQueueError
from django_jobguard.models import IdempotencyKey, Job, ReplayEvent
from tests.support.dlq import dead_charge
from tests.support.factories import make_user
from tests.testapp import tasks, tasks_dlq

pytestmark = pytest.mark.django_db


def test_enqueue_returns_the_stored_job_with_resolved_options():
    job = tasks.add.enqueue(1, b=2)
    job.refresh_from_db()
    assert job.task_name == "tests.testapp.tasks.add"
    assert job.queue_name == "default"
    assert (job.args, job.kwargs) == ([1], {"b": 2})
    assert job.status == "queued"
    assert job.visibility_timeout == 30  # from JOBGUARD["QUEUES"]["default"] in tests/settings.py
    assert job.max_attempts == 5
    assert job.run_after is not None and job.enqueued_at is not None


def test_task_options_win_over_queue_options():
    job = tasks.short_lease.enqueue("m")
    assert job.visibility_timeout == 2


def test_enqueue_inside_a_rolled_back_transaction_leaves_no_job():
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1)
        raise RuntimeError("roll back")
    assert not Job.objects.exists()


def test_arguments_that_do_not_bind_raise_and_write_nothing():
    with pytest.raises(InvalidArgumentsError, match="missing a required argument: 'a'"):
        tasks.add.enqueue(b=1)
    assert not Job.objects.exists()


def test_non_json_arguments_name_the_offending_part_and_write_nothing():
    with pytest.raises(
        InvalidArgumentsError,
        match=r"kwargs\['b'\]: Unsupported type: datetime.datetime is not JSON-serialisable",
    ):
        tasks.add.enqueue(1, b=timezone.now())
    with pytest.raises(InvalidArgumentsError, match=r"args\[0\]\['k'\]\[1\]"):
        tasks.add.enqueue({"k": [1, {2}]})
    with pytest.raises(InvalidArgumentsError, match="finite"):
        tasks.add.enqueue(float("nan"))
    assert not Job.objects.exists()


def test_using_sets_priority_queue_and_run_after():
    when = timezone.now() + datetime.timedelta(hours=1)
    job = tasks.add.using(priority=7, queue_name="fast", run_after=when).enqueue(1)
    job.refresh_from_db()
    assert (job.priority, job.queue_name) == (7, "fast")
    assert job.run_after == when


def test_run_after_as_timedelta_uses_the_database_clock():
    job = tasks.add.using(run_after=datetime.timedelta(minutes=10)).enqueue(1)
    delta = job.run_after - job.enqueued_at
    assert datetime.timedelta(minutes=9, seconds=59) < delta < datetime.timedelta(minutes=10, seconds=1)


def test_naive_run_after_is_refused():
    with pytest.raises(InvalidArgumentsError, match="aware"):
        tasks.add.using(run_after=datetime.datetime(2030, 1, 1))  # noqa: DTZ001


def test_bulk_enqueue_validates_every_call_before_writing():
    with pytest.raises(InvalidArgumentsError):
        tasks.add.bulk_enqueue([((1,), {}), ((), {})])
    assert not Job.objects.exists()
    jobs = tasks.add.bulk_enqueue([((i,), {"b": i}) for i in range(50)])
    assert len(jobs) == 50
    assert Job.objects.filter(status="queued").count() == 50


def test_claim_index_is_partial_on_queued_rows():
    with connection.cursor() as cursor:
        indexes = connection.introspection.get_constraints(cursor, "jobguard_job")
    if connection.vendor == "mysql":
        # No partial indexes there: the claim's index leads with status instead.
        due = indexes["jobguard_job_due_my_idx"]["columns"]
        assert due == ["status", "queue_name", "priority", "run_after", "id"]
        assert indexes["jobguard_job_due_all_my_idx"]["columns"] == ["status", "priority", "run_after", "id"]
        return
    assert "jobguard_job_due_idx" in indexes
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'jobguard_job_due_idx'")
            assert "WHERE ((status)::text = 'queued'::text)" in cursor.fetchone()[0]


@pytest.mark.parametrize("bulk", [False, True])
@pytest.mark.parametrize("run_after", [None, datetime.timedelta(minutes=1), "at"])
def test_the_returned_job_equals_the_stored_row_with_aware_timestamps(bulk, run_after):
    at = timezone.now() + datetime.timedelta(hours=1)
    configured = tasks.add.using(run_after=at if run_after == "at" else run_after)
    job = configured.bulk_enqueue([((1,), {})])[0] if bulk else configured.enqueue(1)
    stored = Job.objects.get(pk=job.pk)
    if run_after == "at":
        assert stored.run_after == at
    elif run_after is not None:
        assert stored.run_after > stored.enqueued_at + datetime.timedelta(seconds=59)
    assert timezone.is_aware(job.run_after) and timezone.is_aware(job.enqueued_at)
    assert (job.run_after, job.enqueued_at) == (stored.run_after, stored.enqueued_at)


# -- bad input gets a clear error and writes nothing, on every enqueue path ---------------------


def deep(depth: int) -> list:
    """A list ``depth`` levels deep ([] is one level)."""
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def cyclic() -> dict:
    note: dict = {"items": []}
    note["items"].append(note)
    return note


#: (value of the argument, what the refusal says after the argument's path)
UNSTORABLE = {
    "deep": (
        deep(500),
        r"kwargs\['b'\] is nested more than 64 levels deep; the limit is JOBGUARD\['MAX_PAYLOAD_DEPTH'\]",
    ),
    "cycle": (cyclic(), r"kwargs\['b'\]\['items'\]\[0\] contains itself \(a reference cycle\)"),
    "nul": ({"note": ["ok", "a\x00b"]}, r"kwargs\['b'\]\['note'\]\[1\] holds a NUL character \(\\x00\)"),
    "nul-key": ({"a\x00": 1}, r"kwargs\['b'\]\['a\\x00'\]: the key holds a NUL character"),
    "surrogate": ("\ud83d", r"kwargs\['b'\] holds a lone surrogate \('\\ud83d'\) at position 0"),
    "too-large": (
        "x" * (1024 * 1024),
        r"take 1,048,[0-9]{3} bytes as JSON, more than the limit of 1,048,576 bytes "
        r"\(JOBGUARD\['MAX_PAYLOAD_BYTES'\]\)",
    ),
}


def nothing_written():
    assert not Job.objects.exists()
    assert not IdempotencyKey.objects.exists()


@pytest.mark.parametrize("case", sorted(UNSTORABLE))
@pytest.mark.parametrize("path", ["enqueue", "using", "keyed", "bulk_enqueue"])
def test_unstorable_arguments_are_refused_on_every_enqueue_path_and_write_nothing(case, path):
    value, message = UNSTORABLE[case]
    with pytest.raises(InvalidArgumentsError, match=message):
        if path == "enqueue":
            tasks.add.enqueue(1, b=value)
        elif path == "using":
            tasks.add.using(priority=3, queue_name="slow").enqueue(1, b=value)
        elif path == "keyed":
            tasks.add.using(idempotency_key=f"k:{case}").enqueue(1, b=value)
        else:
            tasks.add.bulk_enqueue([((1,), {"b": 2}), ((1,), {"b": value})])
    nothing_written()


@pytest.mark.parametrize("case", ["nul", "nul-key", "surrogate", "deep"])
def test_a_refused_enqueue_leaves_the_callers_transaction_usable(case):
    """Today's PostgreSQL failure: DataError at the INSERT, then every query of the block fails."""
    value, message = UNSTORABLE[case]
    with transaction.atomic():
        with pytest.raises(InvalidArgumentsError, match=message):
            tasks.add.enqueue(1, b=value)
        assert Job.objects.count() == 0  # the transaction still answers
        kept = tasks.add.enqueue(1, b=2)
    assert list(Job.objects.values_list("pk", flat=True)) == [kept.pk]


@pytest.mark.postgres
@pytest.mark.parametrize("case", ["nul", "nul-key", "surrogate"])
def test_on_postgresql_strings_jsonb_rejects_are_refused_before_any_insert(case):
    value, message = UNSTORABLE[case]
    statements: list[str] = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with transaction.atomic():
        with connection.execute_wrapper(record), pytest.raises(InvalidArgumentsError, match=message):
            tasks.add.using(idempotency_key=f"pg:{case}").enqueue(1, b=value)
        assert not [sql for sql in statements if sql.lstrip().upper().startswith("INSERT")]
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")  # not "current transaction is aborted"
            assert cursor.fetchone() == (1,)
        tasks.add.enqueue(1, b=3)
    assert Job.objects.count() == 1


def test_storable_text_is_kept_exactly_on_both_databases():
    text = 'naïve 日本語 🎉 \t\n\x01 \\ " \u2028'
    job = tasks.add.enqueue(1, b={text: [text]})
    assert Job.objects.get(pk=job.pk).kwargs == {"b": {text: [text]}}


def test_the_size_and_depth_limits_follow_the_settings(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "MAX_PAYLOAD_BYTES": 64, "MAX_PAYLOAD_DEPTH": 2}
    tasks.add.enqueue(1, b=[[1]])
    with pytest.raises(InvalidArgumentsError, match=r"kwargs\['b'\] is nested more than 2 levels"):
        tasks.add.enqueue(1, b=[[[1]]])
    with pytest.raises(InvalidArgumentsError, match=r"more than the limit of 64 bytes"):
        tasks.add.enqueue(1, b="x" * 60)
    assert Job.objects.count() == 1


def test_a_misspelt_argument_is_reported_as_unexpected_and_missing():
    with pytest.raises(InvalidArgumentsError) as refused:
        tasks_dlq.charge.enqueue(ordr_id=4, amount=100)
    assert str(refused.value).endswith(
        ": unexpected keyword argument 'ordr_id'; missing a required argument: 'order_id'."
    )
    with pytest.raises(InvalidArgumentsError, match=r"too many positional arguments \(3 given, 2 taken\)"):
        tasks.add.enqueue(1, 2, 3)
    nothing_written()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"run_after": "tomorrow"}, "run_after must be an aware datetime or a timedelta, not str 'tomorrow'"),
        ({"run_after": 60}, "run_after must be an aware datetime or a timedelta, not int 60"),
        ({"priority": 500}, "priority must be between -100 and 100, not 500."),
        ({"priority": "high"}, "priority must be an integer, not 'high'."),
        ({"queue_name": ""}, "queue_name must be a non-empty string, not ''."),
        ({"queue_name": 7}, "queue_name must be a non-empty string, not 7."),
        ({"idempotency_key": 5}, "idempotency_key must be a string, not 5."),
        ({"idempotency_key": "k" * 256}, "idempotency_key must be at most 255 characters."),
    ],
)
def test_bad_using_options_are_refused_with_an_invalid_arguments_error(options, message):
    with pytest.raises(InvalidArgumentsError) as refused:
        tasks.add.using(**options).enqueue(1)
    assert str(refused.value).startswith(message)
    nothing_written()


@pytest.mark.parametrize("path", ["enqueue", "bulk_enqueue"])
def test_a_lock_key_longer_than_its_column_is_refused_and_writes_nothing(path):
    # 255 characters hold the prefix ("jobguard:lock:") and the key: "res:" + 237 fit.
    longest = tasks.locked_interval.enqueue("x" * 237)
    # The lock takes it (its own limit is the prefix and the key together, 255).
    assert lock(longest.lock_key, ttl=5).name == "jobguard:lock:" + longest.lock_key
    Job.objects.all().delete()
    with pytest.raises(
        InvalidArgumentsError, match="gave a key of 242 characters; a lock key must have 1 to 241"
    ):
        if path == "enqueue":
            tasks.locked_interval.enqueue("x" * 238)
        else:
            tasks.locked_interval.bulk_enqueue([(("a",), {}), (("x" * 238,), {})])
    nothing_written()


def test_the_lock_key_limit_leaves_room_for_the_configured_prefix(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "LOCKS": {**settings.JOBGUARD["LOCKS"], "PREFIX": "p:"}}
    assert len(tasks.locked_interval.enqueue("x" * 249).lock_key) == 253
    with pytest.raises(InvalidArgumentsError, match="1 to 253"):
        tasks.locked_interval.enqueue("x" * 250)


# -- queues ------------------------------------------------------------------------------------


def strict(**changes):
    """The test settings with undeclared queues refused (tests/settings.py allows them)."""
    from django.conf import settings

    return override_settings(JOBGUARD={**settings.JOBGUARD, "ALLOW_UNDECLARED_QUEUES": False, **changes})


def test_an_undeclared_queue_is_refused_naming_the_known_ones():
    with strict(), pytest.raises(UnknownQueueError) as refused:
        tasks.add.using(queue_name="typo").enqueue(1)
    assert str(refused.value) == (
        "tests.testapp.tasks.add: queue 'typo' is not declared in JOBGUARD['QUEUES']; known queues: "
        "default, jobguard.cache, slow. Check the spelling, declare it there, or set "
        "JOBGUARD['ALLOW_UNDECLARED_QUEUES'] = True to allow free-form queue names."
    )
    assert isinstance(refused.value, InvalidArgumentsError)
    with strict(), pytest.raises(UnknownQueueError, match="queue 'context' is not declared"):
        tasks.describe_context.enqueue()  # @task(queue_name="context")
    with strict(), pytest.raises(UnknownQueueError):
        tasks.add.using(queue_name="typo").bulk_enqueue([((1,), {})])
    nothing_written()


def test_declared_queues_and_the_default_queue_are_accepted():
    with strict(QUEUES={"slow": {}}):  # "default" is not listed: DEFAULT_QUEUE is always known
        assert tasks.add.enqueue(1).queue_name == "default"
        assert tasks.slow_record.enqueue("m", 0).queue_name == "slow"
    with strict(QUEUES={"slow": {}}, DEFAULT_QUEUE="main"):
        assert tasks.add.enqueue(1).queue_name == "main"
        with pytest.raises(UnknownQueueError, match=r"known queues: jobguard\.cache, main, slow"):
            tasks.add.using(queue_name="default").enqueue(1)


def test_without_declared_queues_or_with_the_opt_in_any_queue_is_accepted():
    with strict(QUEUES={}):
        assert tasks.add.using(queue_name="anything").enqueue(1).queue_name == "anything"
    with strict(ALLOW_UNDECLARED_QUEUES=True):
        assert tasks.add.using(queue_name="free-form").enqueue(1).queue_name == "free-form"


# -- the replay paths: dlq.request_replay and the admin's replay form --------------------------


@pytest.fixture
def requester():
    return make_user("rita", "request_replay", "view_payload", "view_deadletter", "view_job")


def replay_state(letter):
    letter.refresh_from_db()
    return (
        letter.replay_state,
        letter.replay_args,
        letter.replay_kwargs,
        ReplayEvent.objects.filter(dead_letter=letter).count(),
        Job.objects.count(),
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("case", sorted(UNSTORABLE))
def test_a_corrected_replay_payload_is_refused_like_an_enqueue(requester, case):
    value, message = UNSTORABLE[case]
    letter = dead_charge(order_id=9)
    before = replay_state(letter)
    with pytest.raises(InvalidArgumentsError, match=message.replace(r"kwargs\['b'\]", r"kwargs\['amount'\]")):
        dlq.request_replay(letter, requester, "fix", kwargs={"order_id": 9, "amount": value})
    assert replay_state(letter) == before


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("kwargs_text", "error"),
    [
        # json.loads reads it; the validator refuses it (a RecursionError, a 500, before).
        (
            '{"order_id": 9, "amount": ' + "[" * 500 + "]" * 500 + "}",
            "kwargs[&#x27;amount&#x27;] is nested more than 64 levels deep",
        ),
        # Too deep for json.loads itself.
        ('{"order_id": 9, "amount": ' + "[" * 100_000 + "]" * 100_000 + "}", "Nested too deeply to read"),
        ('{"order_id": 9, "amount": "a\\u0000b"}', "holds a NUL character"),
        ('{"order_id": 9, "amount": "\\ud800"}', "holds a lone surrogate"),
    ],
)
def test_the_admin_replay_form_shows_a_refused_payload_as_a_form_error(client, requester, kwargs_text, error):
    letter = dead_charge(order_id=9)
    before = replay_state(letter)
    client.force_login(requester)
    url = reverse("admin:jobguard_deadletter_replay", args=[letter.pk, "request"])
    response = client.post(url, {"reason": "fix", "args": "[]", "kwargs": kwargs_text})
    assert response.status_code == 200
    assert error in response.content.decode()
    assert replay_state(letter) == before


def test_enqueue_exposed_takes_only_tasks_declared_api_true_and_writes_nothing_otherwise():
    from django_jobguard.enqueue import enqueue_exposed
    from django_jobguard.exceptions import TaskNotExposedError, UnknownTaskError

    with pytest.raises(TaskNotExposedError, match=r"@task\(api=True\)"):
        enqueue_exposed("tests.testapp.tasks.add", [1], {})
    with pytest.raises(UnknownTaskError, match="nope"):
        enqueue_exposed("nope", [], {})
    assert Job.objects.count() == 0
    job, created = enqueue_exposed("tests.testapp.tasks.api_add", [1], {}, idempotency_key="k", priority=4)
    again, created_again = enqueue_exposed(
        "tests.testapp.tasks.api_add", [1], {}, idempotency_key="k", priority=4
    )
    assert (created, created_again, again.pk) == (True, False, job.pk)
    with pytest.raises(IdempotencyConflict, match="priority 4"):
        enqueue_exposed("tests.testapp.tasks.api_add", [1], {}, idempotency_key="k", priority=5)
    assert Job.objects.count() == 1
