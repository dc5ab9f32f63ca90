"""The database's text columns: a value at its documented maximum is stored intact, one past
it is refused with a clear error before anything is written, never a database error later.

``COLUMNS`` names every CharField and TextField of the jobguard models and how its text gets
there; a new column fails :func:`test_every_text_column_is_classified` until it is added. The
columns a caller, an operator or a task author can fill are probed through their public entry
point (enqueue, the workflow builders, the worker, the limited claim) on the database under test:
SQLite by default, PostgreSQL or MariaDB with ``JOBGUARD_TEST_DATABASE_URL`` (where a too-long
value is a ``DataError``, which SQLite would have stored).
"""

import io
from collections.abc import Callable

import pytest
from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, models
from django.test import override_settings

from django_jobguard import InvalidArgumentsError, Rate, chain, conf, store, task
from django_jobguard.conf import WORKER_ID_MAX_LENGTH
from django_jobguard.exceptions import InvalidTaskError
from django_jobguard.flow import hot_keys
from django_jobguard.models import Breaker, FlowRate, IdempotencyKey, Job, Schedule, Workflow
from django_jobguard.registry import registry
from django_jobguard.worker import Worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("claims_start_from_the_head"),
]

#: How each text column is filled. "probed": by callers, operators or task authors, through an
#: entry point probed below. "choices": one of its TextChoices. "system": by jobguard from its
#: own values (tokens, digests, clocks). "clipped": free text cut to JOBGUARD["MAX_ERROR_CHARS"]
#: or to its width where it is written (tests/integration/worker/test_worker.py). "text": a TextField,
#: without a width on any database. "settings": from JOBGUARD settings, checked when they are read
#: (probed below: the longest that fits is stored intact, one more is refused by the parser).
#: "user": an operator's user name (Django's 150 characters). A "probed" column that settings
#: fill too says so, and is probed both ways.
COLUMNS = {
    "Job.task_name": "probed",
    "Job.queue_name": "probed",  # and JOBGUARD["QUEUES"], DEFAULT_QUEUE: settings
    "Job.status": "choices",
    "Job.lease_token": "system",
    "Job.worker_id": "probed",
    "Job.last_error": "clipped",
    "Job.idempotency_key": "probed",
    "Job.lock_key": "probed",
    "Job.handler_version": "probed",  # and JOBGUARD["HANDLER_VERSION"]: settings
    "IdempotencyKey.key": "probed",
    "IdempotencyKey.scope": "probed",
    "IdempotencyKey.fingerprint": "system",
    "IdempotencyKey.status": "choices",
    "DeadLetter.task_name": "probed",  # copied from its job
    "DeadLetter.queue_name": "probed",
    "DeadLetter.reason": "choices",
    "DeadLetter.category": "choices",
    "DeadLetter.error_class": "clipped",
    "DeadLetter.error_message": "clipped",
    "DeadLetter.traceback": "clipped",
    "DeadLetter.handler_version": "probed",
    "DeadLetter.worker_id": "probed",
    "DeadLetter.idempotency_key": "probed",
    "DeadLetter.lock_key": "probed",
    "DeadLetter.replay_state": "choices",
    "DeadLetter.replay_reason": "text",
    "ReplayEvent.action": "choices",
    "ReplayEvent.actor_name": "user",
    "ReplayEvent.reason": "text",
    "Lock.key": "probed",  # the job's lock key behind JOBGUARD["LOCKS"]["PREFIX"] (settings)
    "Lock.token": "system",
    "Schedule.name": "settings",
    "Schedule.task_name": "probed",  # and JOBGUARD["SCHEDULES"][name]["task"]: settings
    "Schedule.cron": "settings",
    "Schedule.timezone": "settings",
    "Schedule.queue_name": "settings",
    "Schedule.missed": "choices",
    "Schedule.source": "choices",
    "QueueState.queue_name": "probed",
    "QueueState.changed_by_name": "user",
    "QueueState.reason": "text",
    "QueueEvent.queue_name": "probed",
    "QueueEvent.action": "choices",
    "QueueEvent.actor_name": "user",
    "QueueEvent.reason": "text",
    "QueueMinute.queue_name": "probed",
    "WorkerBeat.worker_id": "probed",
    "WorkerBeat.host": "system",  # the host name (at most 253 characters)
    "WorkerBeat.queues": "clipped",  # cut to its 1,000 characters when written
    "LockRelease.key": "probed",
    "LockRelease.actor_name": "user",
    "LockRelease.reason": "text",
    "FlowRate.key": "probed",  # and rate:limit:<name> of JOBGUARD["LIMITS"]: settings
    "Workflow.kind": "choices",
    "Workflow.state": "choices",
    "Workflow.name": "probed",
    "WorkflowCallback.when": "system",
    "JobDependency.result_as": "system",  # a parameter name of the task
    "Breaker.name": "settings",
    "Breaker.state": "choices",
    "Breaker.changed_by_name": "user",
    "Breaker.reason": "text",
    "BreakerEvent.name": "settings",
    "BreakerEvent.from_state": "choices",
    "BreakerEvent.to_state": "choices",
    "BreakerEvent.actor_name": "user",
    "BreakerEvent.reason": "text",
    "ReplayRateChange.actor_name": "user",
    "ReplayRateChange.reason": "text",
    "OutboxMessage.destination": "settings",  # a name of JOBGUARD["OUTBOX"]["DESTINATIONS"]
    "OutboxMessage.key": "probed",
    "OutboxMessage.state": "choices",
    "OutboxMessage.last_error": "clipped",
    "OutboxMessage.resolution": "system",  # "replayed" or "skipped"
    "OutboxMessage.resolved_by": "user",
    "OutboxMessage.resolution_reason": "text",
    "OutboxKey.destination": "settings",
    "OutboxKey.key": "probed",  # the message's, by publish()
    "OutboxCursor.destination": "settings",
    "OutboxCursor.key": "probed",  # the message's, by publish()
    "OutboxCursor.lease_token": "system",
}


def text_columns() -> dict[str, models.Field]:
    return {
        f"{model.__name__}.{field.name}": field
        for model in apps.get_app_config("jobguard").get_models()
        for field in model._meta.get_fields()
        if isinstance(field, models.CharField | models.TextField)
    }


def width(column: str) -> int:
    return text_columns()[column].max_length


def test_every_text_column_is_classified():
    assert set(text_columns()) == set(COLUMNS)
    for column, how in COLUMNS.items():
        field = text_columns()[column]
        assert (how == "choices") == bool(field.choices), column
        assert (how == "text") <= isinstance(field, models.TextField), column


@pytest.fixture
def declare():
    """Declare tasks for the test (unregistered after it)."""
    hot_keys.clear()
    declared = []

    def make(name: str, **options) -> object:
        def handler(key: str = "k") -> None:
            """Does nothing: the probes are about what is stored."""

        made = task(name=name, queue_name=options.pop("queue_name", "text-probe"), **options)(handler)
        declared.append(made)
        return made

    yield make
    for made in declared:
        registry.unregister(made.name)


def refused(action: Callable[[], object], error: type[Exception], *words: str) -> None:
    """``action`` raises ``error`` naming ``words`` (not a database error) and writes no job."""
    before = Job.objects.count()
    try:
        action()
    except DatabaseError as exc:  # pragma: no cover - what the contract forbids
        pytest.fail(f"a database error instead of a clear refusal: {exc!r}")
    except error as exc:
        for word in words:
            assert word in str(exc), str(exc)
    else:
        pytest.fail(f"{action} was not refused")
    assert Job.objects.count() == before


def test_task_name_handler_version_and_idempotency_scope(declare):
    for option in ("handler_version", "idempotency_scope"):
        limit = width("Job.handler_version") if option == "handler_version" else width("IdempotencyKey.scope")
        made = declare(f"probe.{option}", **{option: "v" * limit})
        job = made.using(idempotency_key="k").enqueue()
        assert (job.handler_version, IdempotencyKey.objects.get(key="k").scope)[
            option != "handler_version"
        ] == "v" * limit
        Job.objects.all().delete()
        IdempotencyKey.objects.all().delete()
        refused(
            lambda o=option, n=limit: declare(f"probe.{o}.over", **{o: "v" * (n + 1)}),
            InvalidTaskError,
            option,
        )
    longest = "t" * width("Job.task_name")
    job = declare(longest).enqueue()
    assert Job.objects.get(pk=job.pk).task_name == longest
    refused(lambda: declare(longest + "t"), InvalidTaskError, "name must be at most 255")


def test_outbox_key(tmp_path):
    from django_jobguard.models import OutboxCursor, OutboxKey, OutboxMessage
    from django_jobguard.outbox import publish
    from tests.outbox.conftest import outbox_settings

    longest = "k" * width("OutboxMessage.key")
    assert width("OutboxKey.key") == width("OutboxCursor.key") == len(longest)
    with override_settings(JOBGUARD={**settings.JOBGUARD, "OUTBOX": outbox_settings(tmp_path)}):
        message = publish("events", {"n": 1}, key=longest)
        assert OutboxMessage.objects.get(pk=message.pk).key == longest
        assert OutboxKey.objects.filter(destination="events", key=longest).exists()
        assert OutboxCursor.objects.filter(destination="events", key=longest).exists()
        with pytest.raises(InvalidArgumentsError, match=f"at most {len(longest)}"):
            publish("events", {"n": 2}, key=longest + "k")
    assert OutboxMessage.objects.count() == 1


def test_queue_name(declare):
    made = declare("probe.queue")
    longest = "q" * width("Job.queue_name")
    assert Job.objects.get(pk=made.using(queue_name=longest).enqueue().pk).queue_name == longest
    refused(lambda: made.using(queue_name=longest + "q").enqueue(), InvalidArgumentsError, "queue_name")


def test_idempotency_key(declare):
    made = declare("probe.key")
    longest = "i" * width("Job.idempotency_key")
    job = made.using(idempotency_key=longest).enqueue()
    assert Job.objects.get(pk=job.pk).idempotency_key == longest
    assert IdempotencyKey.objects.get().key == longest
    refused(lambda: made.using(idempotency_key=longest + "i").enqueue(), InvalidArgumentsError, "255")
    templated = declare("probe.key.template", idempotency_key="order:{key}")
    over = "i" * (width("Job.idempotency_key") - len("order:") + 1)
    refused(lambda: templated.enqueue(over), InvalidArgumentsError, "idempotency_key")


def test_lock_key(declare):
    from django_jobguard.conf import get_settings

    made = declare("probe.lock", lock="doc:{key}")
    room = width("Lock.key") - len(get_settings().locks.prefix) - len("doc:")
    job = made.enqueue("l" * room)
    assert Job.objects.get(pk=job.pk).lock_key == "doc:" + "l" * room
    refused(lambda: made.enqueue("l" * (room + 1)), InvalidArgumentsError, "lock template")


def test_rate_key_stored_by_the_claim(declare):
    name = "probe.rate." + "r" * 50
    made = declare(name, queue_name="text-probe-rate", rate=Rate("100/s", key="{key}", burst=100))
    room = width("FlowRate.key") - len(f"r:{name}|")
    job = made.enqueue("r" * room)
    claimed = store.claim("default", ["text-probe-rate"], 5, "probe-worker", flow=registry.flow_plan())
    assert [each.id for each in claimed] == [job.id]
    assert FlowRate.objects.filter(key=f"r:{name}|{'r' * room}").exists()
    refused(lambda: made.enqueue("r" * (room + 1)), InvalidArgumentsError, "rate key", "255")


def test_worker_id_written_by_each_claim(declare):
    made = declare("probe.worker")
    job = made.enqueue()
    longest = "w" * WORKER_ID_MAX_LENGTH
    assert Worker(burst=True, install_signal_handlers=False, worker_id=longest, poll_interval=0.05).run() == 0
    assert Job.objects.get(pk=job.pk).worker_id == longest
    refused(
        lambda: Worker(burst=True, install_signal_handlers=False, worker_id=longest + "w"),
        ValueError,
        "worker_id must be at most 128",
    )
    # The command line: a clean CommandError naming the option and the limit, not a traceback.
    job = made.enqueue()
    longest = "c" * WORKER_ID_MAX_LENGTH
    call_command(
        "jobguard_worker", "--burst", "--queue", "text-probe", "--worker-id", longest, stdout=io.StringIO()
    )
    assert Job.objects.get(pk=job.pk).worker_id == longest
    refused(
        lambda: call_command(
            "jobguard_worker", "--burst", "--worker-id", longest + "c", stdout=io.StringIO()
        ),
        CommandError,
        "--worker-id is 129 characters long",
        f"at most {WORKER_ID_MAX_LENGTH}",
    )
    refused(
        lambda: call_command("jobguard_worker", "--burst", "--worker-id", "w\x00", stdout=io.StringIO()),
        CommandError,
        "--worker-id holds a NUL character",
    )


def test_workflow_name(declare):
    made = declare("probe.workflow")
    longest = "n" * width("Workflow.name")
    workflow = chain(made.s(), made.s()).enqueue(name=longest)
    assert Workflow.objects.get(pk=workflow.pk).name == longest
    Job.objects.all().delete()
    refused(lambda: chain(made.s(), made.s()).enqueue(name=longest + "n"), InvalidArgumentsError, "name")
    assert Workflow.objects.count() == 1


def refused_setting(raw: dict, *words: str) -> None:
    """The settings ``raw`` are refused when read, naming ``words`` (nothing reaches a column)."""
    with pytest.raises(ImproperlyConfigured) as info:
        conf.parse(raw)
    for word in words:
        assert word in str(info.value), str(info.value)


def with_settings(**changes: object) -> dict:
    return {**settings.JOBGUARD, **changes}


def test_shared_limit_names_stored_by_the_claim(declare):
    """A limit's rate state is stored as rate:limit:<name>, its breaker and budget under its name."""
    rated = "l" * (width("FlowRate.key") - len("rate:limit:"))
    guarded = "g" * width("Breaker.name")
    limits = {
        rated: {"rate": "100/s", "burst": 100},
        guarded: {"concurrency": 5, "retry_budget": True, "breaker": True},
    }
    with override_settings(JOBGUARD=with_settings(LIMITS=limits)):
        jobs = [
            declare(f"probe.limit.{n}", queue_name="text-probe-limit", limit=name).enqueue()
            for n, name in enumerate(limits)
        ]
        claimed = store.claim("default", ["text-probe-limit"], 5, "probe-worker", flow=registry.flow_plan())
        assert sorted(each.id for each in claimed) == sorted(job.id for job in jobs)
        assert FlowRate.objects.filter(key=f"rate:limit:{rated}").exists()
        assert Breaker.objects.filter(name=guarded).exists()
    # One more character: refused when the settings are read, before any claim.
    refused_setting(
        with_settings(LIMITS={rated + "l": limits[rated]}),
        f"JOBGUARD['LIMITS']['{rated}l']",
        f"at most {len(rated)}",
        "rate:limit:<name>",
    )
    refused_setting(
        with_settings(LIMITS={guarded + "g": limits[guarded]}),
        f"JOBGUARD['LIMITS']['{guarded}g']",
        f"at most {len(guarded)}",
        "breaker",
    )


def test_queue_names_and_handler_version_from_settings(declare):
    queue = "s" * width("Job.queue_name")
    version = "v" * width("Job.handler_version")
    with override_settings(JOBGUARD=with_settings(QUEUES={queue: {}}, HANDLER_VERSION=version)):
        job = declare("probe.settings.queue", queue_name=queue).enqueue()
        assert Job.objects.filter(pk=job.pk, queue_name=queue, handler_version=version).exists()
    refused_setting(with_settings(QUEUES={queue + "s": {}}), "JOBGUARD['QUEUES']", f"at most {len(queue)}")
    refused_setting(
        with_settings(DEFAULT_QUEUE=queue + "s"), "JOBGUARD['DEFAULT_QUEUE']", f"at most {len(queue)}"
    )
    refused_setting(with_settings(HANDLER_VERSION=version + "v"), "JOBGUARD['HANDLER_VERSION']", "at most 64")


def test_schedule_columns_from_settings():
    """Each schedule column settings fill: the longest is stored intact, one more refused when read."""
    longest = {
        "name": "n" * width("Schedule.name"),
        "task": "t" * width("Schedule.task_name"),
        "cron": "*" * width("Schedule.cron"),
        "timezone": "z" * width("Schedule.timezone"),
        "queue_name": "q" * width("Schedule.queue_name"),
    }
    entry = {option: longest[option] for option in ("task", "cron", "timezone", "queue_name")}
    parsed = conf.parse(with_settings(SCHEDULES={longest["name"]: entry})).schedules[longest["name"]]
    row = Schedule.objects.create(
        name=parsed.name,
        task_name=parsed.task,
        cron=parsed.cron,
        timezone=parsed.timezone,
        queue_name=parsed.queue_name,
    )
    row.refresh_from_db()
    assert (row.name, row.task_name, row.cron, row.timezone, row.queue_name) == tuple(longest.values())
    refused_setting(
        with_settings(SCHEDULES={longest["name"] + "n": entry}), "JOBGUARD['SCHEDULES']", "at most 200"
    )
    for option in entry:
        over = {**entry, option: entry[option] + "x"}
        refused_setting(
            with_settings(SCHEDULES={"s": over}),
            f"JOBGUARD['SCHEDULES']['s']['{option}']",
            f"at most {len(entry[option])}",
        )
