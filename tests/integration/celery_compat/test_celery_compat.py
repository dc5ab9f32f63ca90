"""The Celery compatibility module: a Celery-style tasks module run by a worker in this process."""

import datetime

import pytest
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db.models.functions import Now
from django.test import override_settings

from django_jobguard import InvalidArgumentsError
from django_jobguard.contrib import celery as compat
from django_jobguard.contrib.celery import (
    AsyncResult,
    beat_schedule,
    chain,
    chord,
    crontab,
    group,
    shared_task,
    signature,
    task_postrun,
    task_prerun,
    task_success,
)
from django_jobguard.contrib.celery.beat import cron_for
from django_jobguard.contrib.celery.options import celery_priority
from django_jobguard.exceptions import InvalidTaskError
from django_jobguard.flow import Rate
from django_jobguard.models import Job
from django_jobguard.registry import registry
from tests.integration.celery_compat import celery_tasks as tasks
from tests.support.dlq import run_burst

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _clean_seen():
    tasks.seen.clear()
    yield
    tasks.seen.clear()


def drain(rounds: int = 20) -> None:
    """Burst workers until nothing is queued (an ack may queue the next step after a burst ends)."""
    for _ in range(rounds):
        Job.objects.filter(status="queued").update(run_after=Now())
        run_burst()
        if not Job.objects.filter(status__in=["queued", "running"]).exists():
            return
    pytest.fail("jobs still queued after draining")


def job_of(result: AsyncResult) -> Job:
    return Job.objects.get(pk=int(result.id))


# -- calling ---------------------------------------------------------------------------------


def test_delay_enqueues_a_job_under_celerys_name_and_get_returns_its_result():
    result = tasks.add.delay(2, 3)
    job = job_of(result)
    assert job.task_name == "tests.integration.celery_compat.celery_tasks.add"
    assert (job.args, job.kwargs) == ([2, 3], {})
    assert result.state == "PENDING"
    assert not result.ready()
    drain()
    assert result.get(timeout=10) == 5
    assert (result.state, result.ready(), result.successful(), result.result) == ("SUCCESS", True, True, 5)


def test_calling_the_task_runs_it_here_without_a_job():
    assert tasks.add(1, 2) == 3
    assert tasks.poll_until_ready(0) == 0  # bind=True: self.request has no id here
    assert tasks.seen[-1]["id"] is None
    assert not Job.objects.exists()


def test_apply_async_countdown_and_eta_become_run_after():
    before = datetime.datetime.now(datetime.UTC)
    later = tasks.add.apply_async((1, 1), countdown=3600)
    naive_eta = datetime.datetime(2099, 1, 1, 12, 0)  # noqa: DTZ001 - Celery reads a naive eta in UTC
    at = tasks.add.apply_async(args=(1, 2), eta=naive_eta)
    assert job_of(later).run_after >= before + datetime.timedelta(seconds=3500)
    assert job_of(at).run_after == naive_eta.replace(tzinfo=datetime.UTC)
    run_burst()
    assert later.state == at.state == "PENDING"  # not due: not run


def test_apply_async_refuses_what_it_cannot_honour_and_writes_nothing():
    for options in ({"expires": 60}, {"task_id": "abc"}, {"link": tasks.mul.s(2)}, {"wat": 1}):
        with pytest.raises(InvalidArgumentsError, match=next(iter(options))):
            tasks.add.apply_async((1, 2), **options)
    with pytest.raises(InvalidArgumentsError, match="Arguments do not fit"):
        tasks.add.delay(1, 2, 3)
    assert not Job.objects.exists()


def test_queue_and_priority_follow_the_brokers_direction():
    with override_settings(CELERY_BROKER_URL="redis://localhost:6379/0"):
        high, low = tasks.add.apply_async((1, 1), priority=0), tasks.add.apply_async((1, 1), priority=9)
    assert (job_of(high).priority, job_of(low).priority) == (0, -90)  # Redis: 0 runs first
    with override_settings(CELERY_BROKER_URL="amqp://guest@localhost//"):
        high = tasks.add.apply_async((1, 1), priority=9, queue="default")
    assert job_of(high).priority == 90  # RabbitMQ: the highest runs first, as in jobguard
    assert celery_priority(200, "highest-first") == 100
    assert job_of(high).queue_name == "default"


def test_task_routes_choose_the_queue():
    with override_settings(CELERY_TASK_ROUTES={"tests.integration.celery_compat.*": {"queue": "routed"}}):
        job = job_of(tasks.mul.delay(2, 2))
    assert job.queue_name == "routed"


def test_celery_uuid_ids_are_refused_by_name():
    with pytest.raises(InvalidArgumentsError, match="dual run"):
        AsyncResult("d9b1d7db-1f4c-4b7e-9d5c-1a1e7c3c7f1e")


# -- options -----------------------------------------------------------------------------------


def test_max_retries_counts_retries_so_max_attempts_is_one_more():
    assert tasks.poll_until_ready.task.max_attempts == 6  # max_retries=5
    assert tasks.add.task.max_attempts == 4  # Celery's default max_retries=3
    assert tasks.forever.task.max_attempts == 1_000_000  # None: "for ever", bounded


def test_rate_time_limit_and_backoff_map_onto_jobguard_options(temporary_tasks):
    # Declared here, not in the tasks module: a rate makes every later worker of the session
    # take the limited claim.
    temporary_tasks.append("tests.celery_options.throttled")
    throttled = _declare(
        "tests.celery_options.throttled",
        rate_limit="10/m",
        time_limit=30,
        retry_backoff=True,
        retry_backoff_max=120,
        autoretry_for=(tasks.FlakyService,),
    )
    jtask = throttled.task
    assert jtask.rate == Rate("10/m")
    assert jtask.timeout == 30
    assert (jtask.retry.base, jtask.retry.max, jtask.retry.jitter) == (1.0, 120.0, 1.0)
    assert jtask.retry_on == (tasks.FlakyService,)
    fixed = tasks.always_down.task.retry
    assert (fixed.base, fixed.max, fixed.jitter) == (0.0, 0.0, 0.0)


def test_an_unknown_option_is_refused_at_declaration():
    with pytest.raises(InvalidTaskError, match="'colour'"):
        shared_task(name="tests.celery.bad_option", colour="red")(lambda: None)
    with pytest.raises(InvalidTaskError, match="rate_limit"):
        shared_task(name="tests.celery.bad_rate", rate_limit="fast")(lambda: None)

    async def coroutine():
        return None

    with pytest.raises(InvalidTaskError, match="async def"):
        shared_task(name="tests.celery.coroutine")(coroutine)
    assert registry.find("tests.celery.coroutine") is None


# -- retries -----------------------------------------------------------------------------------


def test_bound_retry_runs_the_same_job_again_with_request_retries_counting():
    result = tasks.poll_until_ready.delay(2)
    drain()
    assert result.get(timeout=10) == 2
    job = job_of(result)
    assert job.attempts == 3
    assert [s["retries"] for s in tasks.seen] == [0, 1, 2]
    assert {s["id"] for s in tasks.seen} == {result.id}
    assert tasks.seen[0]["name"] == tasks.poll_until_ready.name


def test_retry_past_max_retries_fails_the_job_at_once():
    result = tasks.gives_up.delay()
    drain()
    job = job_of(result)
    assert (job.status, job.attempts) == ("dead", 2)  # max_retries=1: two runs
    assert result.state == "FAILURE"
    assert "no retries left" in job.last_error
    assert "FlakyService" in job.last_error


def test_autoretry_for_retries_listed_errors_up_to_max_retries():
    result = tasks.always_down.delay()
    drain()
    assert len(tasks.seen) == 3  # max_retries=2: three runs
    assert (job_of(result).status, result.state, result.failed()) == ("dead", "FAILURE", True)
    assert "the partner is down" in str(result.result)
    with pytest.raises(Exception, match="the partner is down"):
        result.get(timeout=5)
    assert isinstance(result.get(timeout=5, propagate=False), Exception)


def test_an_error_not_in_autoretry_for_fails_at_once_as_in_celery():
    result = tasks.broken.delay()
    drain()
    assert len(tasks.seen) == 1
    assert job_of(result).status == "dead"


def test_ignore_result_stores_none_and_get_says_there_is_none_to_wait_for():
    from django_jobguard.exceptions import ResultNotStored

    assert tasks.fire_and_forget.task.result_retention == 0
    result = tasks.fire_and_forget.delay(7)
    drain()
    assert tasks.seen == [{"task": "fire_and_forget", "n": 7}]
    assert job_of(result).result is None
    assert result.state == "SUCCESS"
    with pytest.raises(ResultNotStored):
        result.get(timeout=5)


def test_revoke_cancels_a_queued_job():
    result = tasks.add.delay(1, 1)
    result.revoke()
    run_burst()
    assert result.state == "REVOKED"
    assert result.ready() and not result.successful()


# -- canvas ------------------------------------------------------------------------------------


def test_a_chain_passes_each_result_first_and_si_takes_none():
    result = chain(tasks.add.s(2, 2), tasks.add.s(4), tasks.mul.s(10), tasks.mul.si(3, 3)).apply_async()
    drain()
    assert result.get(timeout=10) == 9
    assert result.parent.get(timeout=10) == 80  # (2 + 2 + 4) * 10
    assert result.parent.parent.get(timeout=10) == 8


def test_the_pipe_builds_a_chain_and_signature_makes_a_step():
    result = (tasks.add.s(1, 1) | signature(tasks.mul, args=(5,)))()
    drain()
    assert result.get(timeout=10) == 10


def test_a_group_gives_its_results_in_member_order():
    result = group(tasks.mul.s(n, n) for n in (3, 1, 2)).apply_async()
    drain()
    assert result.get(timeout=10) == [9, 1, 4]
    assert result.ready() and result.successful() and result.completed_count() == 3


def test_a_chord_callback_receives_the_list_of_results():
    result = chord([tasks.add.s(n, n) for n in range(4)])(tasks.tsum.s())
    drain()
    assert result.get(timeout=10) == 0 + 2 + 4 + 6
    assert result.children.get(timeout=10) == [0, 2, 4, 6]


def test_a_group_inside_a_chain_is_refused_with_what_to_write():
    with pytest.raises(InvalidArgumentsError, match="chord"):
        chain(group(tasks.add.s(1, 1)), tasks.tsum.s())


# -- eager mode (Celery-style test suites) -----------------------------------------------------


def test_always_eager_runs_calls_and_canvas_in_process():
    with override_settings(CELERY_TASK_ALWAYS_EAGER=True):
        assert tasks.add.delay(2, 2).get() == 4
        assert chain(tasks.add.s(1, 1), tasks.mul.s(3)).delay().get() == 6
        assert chord([tasks.add.s(1, 1), tasks.add.s(2, 2)])(tasks.tsum.s()).get() == 6
        assert tasks.poll_until_ready.delay(0).get() == 0
    assert not Job.objects.exists()


def test_eager_failures_propagate_when_asked():
    with override_settings(CELERY_TASK_ALWAYS_EAGER=True):
        assert tasks.broken.delay().failed()
        with override_settings(CELERY_TASK_EAGER_PROPAGATES=True), pytest.raises(ValueError, match="a bug"):
            tasks.broken.delay()


# -- signals -----------------------------------------------------------------------------------


def test_celerys_task_signals_are_sent_around_a_workers_run():
    received: list[tuple] = []

    def prerun(sender, task_id, task, args, kwargs, **extra):
        received.append(("prerun", task_id, tuple(args)))

    def postrun(sender, task_id, retval, state, **extra):
        received.append(("postrun", task_id, retval, state))

    def success(sender, result, **extra):
        received.append(("success", sender.name, result))

    task_prerun.connect(prerun)
    task_postrun.connect(postrun)
    task_success.connect(success)
    try:
        result = tasks.add.delay(20, 22)
        drain()
    finally:
        task_prerun.disconnect(prerun)
        task_postrun.disconnect(postrun)
        task_success.disconnect(success)
    assert received == [
        ("prerun", result.id, (20, 22)),
        ("success", tasks.add.name, 42),
        ("postrun", result.id, 42, "SUCCESS"),
    ]


# -- beat --------------------------------------------------------------------------------------


def test_beat_entries_become_jobguard_schedules():
    converted = beat_schedule(
        {
            "report": {
                "task": "proj.tasks.report",
                "schedule": crontab(hour=3, minute=0, day_of_week="mon-fri"),
            },
            "poll": {
                "task": "proj.tasks.poll",
                "schedule": 30.0,
                "args": (1,),
                "options": {"queue": "polls"},
            },
            "sweep": {"task": "proj.tasks.sweep", "schedule": datetime.timedelta(minutes=15)},
        },
        timezone="Europe/Paris",
    )
    assert converted["report"] == {
        "task": "proj.tasks.report",
        "cron": "0 3 * * MON-FRI",
        "timezone": "Europe/Paris",
        "args": [],
        "kwargs": {},
    }
    assert converted["poll"]["cron"] == "*/30 * * * * *"
    assert (converted["poll"]["args"], converted["poll"]["queue_name"]) == ([1], "polls")
    assert converted["sweep"]["cron"] == "*/15 * * * *"
    assert crontab(hour=7).cron == "* 7 * * *"  # Celery's defaults are "*"
    assert cron_for(datetime.timedelta(hours=6)) == "0 */6 * * *"


def test_an_interval_no_cron_can_tick_is_refused_naming_the_entry():
    with pytest.raises(ImproperlyConfigured, match=r"'odd'.*crontab"):
        beat_schedule({"odd": {"task": "t", "schedule": 45 * 60}})


def test_a_converted_beat_schedule_is_run_by_the_scheduler_and_an_unconverted_one_is_named():
    entries = {"every-minute": {"task": tasks.add.name, "schedule": 60.0, "args": (1, 2)}}
    with override_settings(CELERY_BEAT_SCHEDULE=entries):
        assert "jobguard.celery.W003" in _check_ids()
        with override_settings(JOBGUARD={**settings.JOBGUARD, "SCHEDULES": beat_schedule(entries)}):
            from django_jobguard import schedules

            assert "jobguard.celery.W003" not in _check_ids()
            spec = schedules.declared_schedules()["every-minute"]
            assert (spec.task, spec.cron, spec.args) == (tasks.add.name, "* * * * *", (1, 2))
            schedules.validate(spec.cron, spec.timezone)
    entries = {"late": {"task": tasks.add.name, "schedule": 60.0, "args": (1, 2), "options": {"expires": 30}}}
    with override_settings(
        CELERY_BEAT_SCHEDULE=entries, JOBGUARD={**settings.JOBGUARD, "SCHEDULES": beat_schedule(entries)}
    ):
        assert "jobguard.celery.W004" in _check_ids()


# -- system checks -----------------------------------------------------------------------------


def _check_ids() -> list[str]:
    return [message.id for message in checks.run_checks()]


def _declare(name: str, **options):
    def func(x):
        return x

    func.__qualname__ = name.rsplit(".", 1)[1]
    func.__module__ = name.rsplit(".", 1)[0]
    return shared_task(name=name, **options)(func)


@pytest.fixture
def temporary_tasks():
    names: list[str] = []
    yield names
    for name in names:
        registry.unregister(name)


def test_every_option_not_honoured_is_named_at_startup(temporary_tasks):
    temporary_tasks.append("tests.celery_checks.soft")
    _declare("tests.celery_checks.soft", soft_time_limit=10, acks_late=False, expires=60)
    messages = [m for m in checks.run_checks() if m.id == "jobguard.celery.W001"]
    named = sorted(
        m.msg.split(": ", 1)[1].split("=")[0] for m in messages if m.obj == "tests.celery_checks.soft"
    )
    assert named == ["acks_late", "expires", "soft_time_limit"]
    assert all(m.hint.startswith("Instead: ") for m in messages)


def test_priorities_without_a_broker_url_are_named(temporary_tasks):
    temporary_tasks.append("tests.celery_checks.urgent")
    _declare("tests.celery_checks.urgent", priority=5)
    assert not hasattr(settings, "CELERY_BROKER_URL")
    assert "jobguard.celery.W005" in _check_ids()
    with override_settings(CELERY_BROKER_URL="redis://localhost"):
        assert "jobguard.celery.W005" not in _check_ids()


def test_celery_settings_not_read_are_named_and_pickle_is_an_error():
    with override_settings(
        CELERY_WORKER_CONCURRENCY=8, CELERY_TASK_SERIALIZER="pickle", CELERY_RESULT_BACKEND="redis://"
    ):
        found = [m for m in checks.run_checks() if m.id.startswith("jobguard.celery.")]
    by_id = {m.id: m for m in found}
    assert "CELERY_WORKER_CONCURRENCY" in by_id["jobguard.celery.W002"].msg
    assert "--concurrency" in by_id["jobguard.celery.W002"].hint
    assert "pickle" in by_id["jobguard.celery.E001"].msg
    assert not any("RESULT_BACKEND" in m.msg for m in found)  # the broker's: nothing to do


def test_the_module_imports_no_model_until_a_result_is_asked_for():
    # A settings module imports crontab and beat_schedule from it.
    assert callable(compat.beat_schedule) and callable(compat.crontab)
    assert compat.AsyncResult is AsyncResult


def test_settings_given_to_the_app_itself_are_named():
    from django_jobguard.contrib.celery import app as app_module

    other = compat.Celery("other")
    try:
        other.conf.beat_schedule = {"x": {"task": tasks.add.name, "schedule": 60}}
        other.config_from_object("proj.celeryconfig")
        messages = [m.msg for m in checks.run_checks() if m.id == "jobguard.celery.W002"]
    finally:
        app_module._apps.remove(other)
    assert "Celery('other').conf.beat_schedule is not read by jobguard." in messages
    assert "Celery('other').config_from_object('proj.celeryconfig') is not read by jobguard." in messages


def test_autoretry_sends_task_retry_then_task_failure():
    retried: list[str] = []
    failed: list[str] = []

    def on_retry(sender, request, reason, **extra):
        retried.append(str(reason))

    def on_failure(sender, task_id, exception, **extra):
        failed.append(str(exception))

    compat.task_retry.connect(on_retry)
    compat.task_failure.connect(on_failure)
    try:
        tasks.always_down.delay()
        drain()
    finally:
        compat.task_retry.disconnect(on_retry)
        compat.task_failure.disconnect(on_failure)
    assert retried == ["the partner is down"] * 2
    assert failed == ["the partner is down"]


def test_signals_connect_as_decorators():
    calls = []

    @compat.task_success.connect
    def bare(sender, result, **extra):
        calls.append(("bare", result))

    @compat.task_success.connect(sender=None, weak=False)
    def with_options(sender, result, **extra):
        calls.append(("options", result))

    try:
        with override_settings(CELERY_TASK_ALWAYS_EAGER=True):
            tasks.add.delay(1, 1)
    finally:
        compat.task_success.disconnect(bare)
        compat.task_success.disconnect(with_options)
    assert sorted(calls) == [("bare", 2), ("options", 2)]


def test_update_state_reports_the_jobs_progress():
    result = tasks.import_rows.delay(3)
    drain()
    assert result.get(timeout=10) == 3
    progress = job_of(result).progress
    assert (progress["done"], progress["total"], progress["message"]) == (3, 3, "PROGRESS")


def test_an_idempotency_key_collapses_the_same_work_enqueued_twice():
    # The dual run's guard on jobguard's side: the old and the new release both enqueue it.
    first, again = tasks.charge.delay(7), tasks.charge.delay(7)
    assert first.id == again.id
    drain()
    assert tasks.seen == [{"task": "charge", "order_id": 7}]


def test_a_custom_base_class_is_named_since_its_hooks_do_not_run(temporary_tasks):
    class Hooked:
        def on_failure(self, *args):
            raise AssertionError("never called")

    temporary_tasks.append("tests.celery_checks.hooked")
    _declare("tests.celery_checks.hooked", base=Hooked)
    hints = [
        m.hint
        for m in checks.run_checks()
        if m.id == "jobguard.celery.W001" and m.obj == "tests.celery_checks.hooked"
    ]
    assert len(hints) == 1 and "task_failure" in hints[0]


def test_a_decimal_argument_is_refused_with_its_conversion_as_by_enqueue():
    import decimal

    with pytest.raises(InvalidArgumentsError, match=r"str\(value\)"):
        tasks.add.delay(decimal.Decimal("10.10"), 1)
    assert not Job.objects.exists()


def test_get_waits_with_job_wait_and_times_out_on_a_job_nobody_runs():
    result = tasks.add.delay(1, 1)
    with pytest.raises(TimeoutError):
        result.get(timeout=0)
    assert result.state == "PENDING"


def test_send_task_enqueues_by_name():
    result = tasks.app.send_task(tasks.mul.name, args=(6, 7))
    drain()
    assert result.get(timeout=10) == 42
    with pytest.raises(InvalidArgumentsError, match="no Celery-style task"):
        tasks.app.send_task("proj.tasks.nothing")


def test_the_broker_given_to_the_app_tells_the_priority_direction():
    from django_jobguard.contrib.celery import app as app_module
    from django_jobguard.contrib.celery import conf

    redis_app = compat.Celery("redis-app", broker="redis://localhost:6379/0")
    try:
        assert conf.priority_direction() == "lowest-first"
        assert job_of(tasks.add.apply_async((1, 1), priority=3)).priority == -30
    finally:
        app_module._apps.remove(redis_app)
        conf.broker_urls.remove("redis://localhost:6379/0")
    assert conf.priority_direction() == "highest-first"


def test_a_chord_whose_member_fails_runs_no_callback_and_get_raises():
    result = chord([tasks.add.s(1, 1), tasks.broken.s()])(tasks.tsum.s())
    drain()
    assert result.state == "FAILURE"
    assert result.id is None  # no callback job was made
    with pytest.raises(Exception, match="a bug, not an outage"):
        result.get(timeout=5)
    assert not Job.objects.filter(task_name=tasks.tsum.name).exists()


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("", ["Celery", "shared_task", "chain", "group", "chord", "signature"]),
        (".result", ["AsyncResult", "GroupResult", "EagerResult"]),
        (".canvas", ["Signature", "chain", "group", "chord", "signature"]),
        (".schedules", ["crontab"]),
        (".signals", ["task_prerun", "task_postrun", "task_success", "task_failure", "task_retry"]),
        (".exceptions", ["MaxRetriesExceededError", "Retry", "SoftTimeLimitExceeded", "TimeoutError"]),
    ],
)
def test_celerys_import_paths_need_only_the_package_changed(module, names):
    import importlib

    found = importlib.import_module(f"django_jobguard.contrib.celery{module}")
    assert [name for name in names if not hasattr(found, name)] == []


def test_autoretry_for_exception_retries_every_error_but_those_excluded(temporary_tasks):
    from django_jobguard.retry import PERMANENT, TRANSIENT, classify

    temporary_tasks.append("tests.celery_options.everything")
    everything = _declare(
        "tests.celery_options.everything", autoretry_for=(Exception,), dont_autoretry_for=(KeyError,)
    )
    assert classify(ValueError("x"), everything.task) == TRANSIENT
    assert classify(KeyError("x"), everything.task) == PERMANENT
    assert classify(ValueError("x"), tasks.always_down.task) == PERMANENT  # not listed: fails at once
