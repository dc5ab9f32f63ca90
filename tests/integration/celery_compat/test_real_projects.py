"""What the Celery projects tried in docs/how-to/move-from-celery.md ("Tried on real projects") needed.

cookiecutter-django's generated ``config/celery_app.py`` connects a receiver to Celery's
``setup_logging`` signal, and its settings set broker and result-backend options that mean
nothing without a broker. The patterns are written here from scratch, not copied.
"""

import logging
from unittest import mock

import pytest
from django.core import checks
from django.db.models.functions import Now
from django.test import override_settings

from django_jobguard.contrib.celery import chain, shared_task
from django_jobguard.contrib.celery.checks import check_settings, check_signals
from django_jobguard.contrib.celery.exceptions import Retry
from django_jobguard.contrib.celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    setup_logging,
)
from django_jobguard.contrib.celery.utils.log import get_task_logger
from django_jobguard.contrib.celery.utils.time import get_exponential_backoff_interval
from django_jobguard.models import Job
from django_jobguard.registry import registry
from tests.support.dlq import run_burst


def test_a_receiver_of_a_logging_signal_imports_and_is_named_since_it_is_never_sent():
    def config_loggers(*args, **kwargs):
        logging.getLogger(__name__).info("never called")

    assert [m.id for m in check_signals()] == []
    setup_logging.connect(config_loggers)  # as cookiecutter-django's celery_app.py does
    after_setup_logger.connect()(config_loggers)  # as a decorator, with parentheses
    try:
        messages = [m for m in checks.run_checks() if m.id == "jobguard.celery.W006"]
    finally:
        setup_logging.disconnect(config_loggers)
        after_setup_logger.disconnect(config_loggers)
    assert sorted(m.msg.split("'s ")[1].split(" ")[0] for m in messages) == [
        "after_setup_logger",
        "setup_logging",
    ]
    assert all("LOGGING" in m.hint for m in messages)
    assert not after_setup_task_logger.has_listeners()
    assert [m.id for m in check_signals()] == []


def test_cookiecutter_djangos_broker_and_result_backend_settings_need_no_word():
    with override_settings(
        CELERY_BROKER_USE_SSL=None,
        CELERY_REDIS_BACKEND_USE_SSL=None,
        CELERY_RESULT_BACKEND_ALWAYS_RETRY=True,
        CELERY_RESULT_BACKEND_MAX_RETRIES=10,
        CELERY_TASK_CREATE_MISSING_QUEUES=False,
        CELERY_TASK_TIME_LIMIT=300,
        CELERY_TASK_SOFT_TIME_LIMIT=60,
    ):
        named = [m.msg for m in check_settings()]
    assert named == ["CELERY_TASK_SOFT_TIME_LIMIT is not read by jobguard."]


def test_celery_task_time_limit_is_the_timeout_of_every_task_that_gives_none(declared):
    declared.extend(["tests.celery_real.slow", "tests.celery_real.own_limit"])
    with override_settings(CELERY_TASK_TIME_LIMIT=300):
        slow = _declare("tests.celery_real.slow", lambda: None)
        own_limit = _declare("tests.celery_real.own_limit", lambda: None, time_limit=30)
    assert (slow.task.timeout, own_limit.task.timeout) == (300, 30)


def test_a_default_queue_named_as_jobguards_needs_no_word():
    with override_settings(CELERY_TASK_DEFAULT_QUEUE="default"):
        assert [m.msg for m in check_settings()] == []
    with override_settings(CELERY_TASK_DEFAULT_QUEUE="celery"):
        assert [m.hint for m in check_settings()] == ["Instead: set JOBGUARD['DEFAULT_QUEUE']."]


# testdrivenio/django-celery-project wraps shared_task in a decorator of its own that calls
# ``task.retry()`` on the task (not a bound self) with a countdown from Celery's backoff helper,
# and its tests patch ``task.retry``.


def _declare(name: str, func, **options):
    module, _, func.__qualname__ = name.rpartition(".")
    func.__module__ = module or "tests.celery_real"
    return shared_task(name=name, **options)(func)


@pytest.fixture
def declared():
    names: list[str] = []
    yield names
    for name in names:
        registry.unregister(name)


@pytest.mark.django_db(transaction=True)
def test_retry_and_request_on_the_task_itself_serve_a_decorator_around_the_function(declared):
    seen: list[int] = []

    def flaky():
        retries = flaky_task.request.retries
        seen.append(retries)
        if retries < 2:
            countdown = get_exponential_backoff_interval(factor=1, retries=retries, maximum=0)
            raise flaky_task.retry(exc=ConnectionError("down"), countdown=countdown)
        return "done"

    declared.append("tests.celery_real.flaky")
    flaky_task = _declare("tests.celery_real.flaky", flaky, max_retries=3)
    result = flaky_task.delay()
    for _ in range(10):
        Job.objects.filter(status="queued").update(run_after=Now())
        run_burst()
        if not Job.objects.filter(status__in=["queued", "running"]).exists():
            break
    assert seen == [0, 1, 2]
    assert result.get(timeout=5) == "done"
    assert flaky_task.request.called_directly  # outside a run: an empty request


def test_a_patched_task_retry_sees_the_calls_made_through_self(declared):
    def subscribe(self, user_id):
        try:
            raise ConnectionError("down")
        except ConnectionError as exc:
            raise self.retry(exc=exc) from exc

    declared.append("tests.celery_real.subscribe")
    subscribe_task = _declare("tests.celery_real.subscribe", subscribe, bind=True)
    with mock.patch.object(subscribe_task, "retry", side_effect=Retry()) as patched:
        with pytest.raises(Retry):
            subscribe_task(1)
    patched.assert_called_once()
    with mock.patch("django_jobguard.contrib.celery.app.CeleryTask.retry", side_effect=Retry()) as patched:
        with pytest.raises(Retry):
            subscribe_task(1)
    assert "exc" in patched.call_args.kwargs
    with pytest.raises(ConnectionError):  # unpatched, called directly: the error in place, as Celery
        subscribe_task(1)


def test_celerys_backoff_helper_and_task_logger():
    assert [get_exponential_backoff_interval(5, n, 600) for n in range(4)] == [5, 10, 20, 40]
    assert get_exponential_backoff_interval(5, 10, 600) == 600
    assert all(0 <= get_exponential_backoff_interval(5, 2, 600, full_jitter=True) <= 20 for _ in range(50))
    assert get_task_logger("polls.tasks") is logging.getLogger("polls.tasks")


def route_by_prefix(name, args, kwargs, options, task=None, **kw):
    """A router function, as testdrivenio/django-celery-project's settings give CELERY_TASK_ROUTES."""
    if ":" in name:
        return {"queue": name.split(":")[0]}
    if args and args[0] == "vip":
        return "high_priority"  # a router may answer with the queue's name alone
    return None


@pytest.mark.django_db(transaction=True)
def test_router_functions_in_task_routes_choose_the_queue(declared):
    declared.extend(["low_priority:cleanup", "tests.celery_real.greet"])
    cleanup = _declare("low_priority:cleanup", lambda: None)
    greet = _declare("tests.celery_real.greet", lambda who: who)
    here = f"{__name__}.route_by_prefix"
    for routes in ((route_by_prefix,), here, [{"tests.celery_real.*": {"queue": "maps"}}, route_by_prefix]):
        with override_settings(CELERY_TASK_ROUTES=routes):
            queues = [
                Job.objects.get(pk=int(result.id)).queue_name
                for result in (cleanup.delay(), greet.delay("vip"), greet.delay("anyone"))
            ]
        if isinstance(routes, list):  # asked in order: the map answers first for greet
            assert queues == ["low_priority", "maps", "maps"]
        else:
            assert queues == ["low_priority", "high_priority", "default"]


@pytest.mark.django_db(transaction=True)
def test_a_chain_step_is_routed_with_its_own_arguments(declared):
    declared.append("tests.celery_real.step")
    step = _declare("tests.celery_real.step", lambda who: who)
    with override_settings(CELERY_TASK_ROUTES=(route_by_prefix,)):
        chain(step.si("vip"), step.si("anyone")).apply_async()
    queues = list(Job.objects.filter(task_name=step.name).order_by("pk").values_list("queue_name", flat=True))
    assert queues == ["high_priority", "default"]
