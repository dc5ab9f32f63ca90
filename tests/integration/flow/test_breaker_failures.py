"""Which failures count toward a circuit breaker: only those that say the dependency is unwell.

A caller who may enqueue must not be able to open a shared breaker for every tenant by sending
bad input (issue 54, point 5). The worker runs in this process (burst mode); the dependency is
``JOBGUARD["LIMITS"]["flow-dep"]`` of tests/settings.py (50% of at least 6 calls in 10 s).
"""

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_jobguard import breakers, task
from django_jobguard.conf import get_settings
from django_jobguard.exceptions import PermanentError, TransientError
from django_jobguard.flow import hot_keys
from django_jobguard.models import Breaker, DeadLetter, Job
from django_jobguard.registry import registry
from django_jobguard.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

DEP = "flow-dep"


class QuotaHiccup(Exception):
    """The dependency's client error for a passing fault, declared transient by the task."""


class SlowAnswer(Exception):
    """A client library's own timeout class, listed in the breaker's ``failures``."""


@task(queue_name=DEP, limit=DEP, max_attempts=1)
def parse_order(raw: str) -> None:
    """Bad input fails with an unclassified ValueError before the dependency is called."""
    int(raw)


@task(queue_name=DEP, limit=DEP, max_attempts=1, retry_on=(QuotaHiccup,))
def call_flaky(n: int) -> None:
    """The dependency fails with an error the task declares transient."""
    raise QuotaHiccup(f"call {n}: try again")


@task(queue_name=DEP, limit=DEP, max_attempts=1)
def call_refused(n: int) -> None:
    """The dependency refuses the connection; nothing declares it, a connection error counts anyway."""
    raise ConnectionRefusedError(f"call {n}: connection refused")


TASKS = [parse_order, call_flaky, call_refused]
for _task in TASKS:
    registry.unregister(_task.name)


@pytest.fixture
def guarded():
    hot_keys.clear()  # what earlier tests' claims remembered
    for one in TASKS:
        registry.register(one)
    yield
    for one in TASKS:
        registry.unregister(one.name)


def run_burst():
    # One job per claim, so the claim after the sixth failure sees the breaker open.
    worker = Worker(burst=True, install_signal_handlers=False, poll_interval=0.05, queues=[DEP], batch_size=1)
    assert worker.run() == 0


def state():
    row = Breaker.objects.filter(name=DEP).first()
    return row.state if row is not None else "closed"


def test_bad_input_fails_its_jobs_but_leaves_the_breaker_closed(guarded):
    jobs = [parse_order.enqueue(f"not-a-number-{n}") for n in range(25)]
    run_burst()
    assert DeadLetter.objects.filter(job_id__in=[j.id for j in jobs]).count() == 25  # every one ran
    assert state() == "closed"
    row = Breaker.objects.filter(name=DEP).first()
    assert row is None or row.failures == 0
    # The dependency's own jobs are still claimed: the bad requests kept no one out.
    ok = call_refused.enqueue(0)
    run_burst()
    assert Job.objects.get(pk=ok.pk).status == "dead"


def test_declared_transient_failures_open_the_breaker(guarded):
    jobs = [call_flaky.enqueue(n) for n in range(25)]
    run_burst()
    assert state() == "open"
    assert "6 of 6 calls failed" in Breaker.objects.get(name=DEP).reason
    waiting = Job.objects.filter(pk__in=[j.id for j in jobs], status="queued", attempts=0).count()
    assert waiting == 25 - 6


def test_connection_errors_open_the_breaker_though_no_task_declares_them(guarded):
    for n in range(8):
        call_refused.enqueue(n)
    run_burst()
    assert state() == "open"


def spec(**options):
    with override_settings(JOBGUARD={**get_settings_dict(), "LIMITS": {DEP: {"breaker": options}}}):
        breaker = get_settings().limits[DEP].breaker
    assert breaker is not None
    return breaker


def get_settings_dict():
    from django.conf import settings

    return dict(settings.JOBGUARD)


def test_what_counts_as_a_failed_call():
    plain = spec()
    listed = spec(failures=[f"{__name__}.SlowAnswer"])
    flaky, parse = call_flaky, parse_order

    def counts(error, category="transient", task=parse, breaker=plain):
        return breakers.is_failed_call(error, category, task, breaker)

    assert not counts(ValueError("bad input"))  # unclassified: the job fails, the breaker does not move
    assert not counts(KeyError("missing field"))
    assert not counts(None)
    assert counts(TimeoutError("read timed out"))
    assert counts(ConnectionResetError("reset by peer"))
    assert counts(TransientError("the handler says so"))
    assert counts(QuotaHiccup("declared"), task=flaky)
    assert not counts(QuotaHiccup("declared by another task"), task=parse)
    assert not counts(SlowAnswer("not listed"))
    assert counts(SlowAnswer("listed"), breaker=listed)
    # A permanent failure is an answer from the dependency, whatever its class.
    assert not counts(PermanentError("refused for good"), category="permanent")
    assert not counts(TimeoutError("fatal_on"), category="permanent")


def test_a_breaker_failures_entry_must_name_exception_classes():
    with pytest.raises(ImproperlyConfigured, match=r"\['failures'\]\['0'\].*cannot be imported"):
        spec(failures=["no.such.Module"])
    with pytest.raises(ImproperlyConfigured, match="is not an exception class"):
        spec(failures=["django_jobguard.task"])
    with pytest.raises(ImproperlyConfigured, match="must be a list of dotted paths"):
        spec(failures="requests.ConnectionError")
