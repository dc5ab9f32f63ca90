import random

import pytest

from django_jobguard import PermanentError, RecoverableError, TransientError
from django_jobguard.conf import RetryPolicy
from django_jobguard.retry import backoff, classify, requested_delay
from tests.testapp.tasks import InvalidOrder, ProviderTimeout, flaky, noop


@pytest.mark.parametrize(
    ("attempt", "expected"), [(1, 5), (2, 10), (3, 20), (4, 40), (6, 160), (7, 300), (50, 300)]
)
def test_backoff_doubles_from_base_and_caps_at_max(attempt, expected):
    policy = RetryPolicy(base=5, max=300, jitter=0)
    assert backoff(policy, attempt) == expected


def test_jitter_stays_within_bounds():
    policy = RetryPolicy(base=5, max=300, jitter=3)
    rng = random.Random(7)
    delays = [backoff(policy, 1, rng) for _ in range(1000)]
    assert min(delays) >= 5
    assert max(delays) <= 8


def test_jitter_spreads_a_thousand_simultaneous_failures_over_several_seconds():
    policy = RetryPolicy(base=5, max=300, jitter=3)
    rng = random.Random(11)
    seconds = {int(backoff(policy, 1, rng)) for _ in range(1000)}
    # Without jitter every retry would land in second 5; with 0-3 s of jitter they spread.
    assert seconds == {5, 6, 7}


def test_our_error_classes_classify_themselves():
    assert classify(TransientError("x"), noop) == "transient"
    assert classify(RecoverableError("x"), noop) == "recoverable"
    assert classify(PermanentError("x"), noop) == "permanent"


def test_task_mappings_classify_user_exceptions():
    assert classify(ProviderTimeout(), flaky) == "transient"
    assert classify(InvalidOrder(), flaky) == "permanent"


def test_unclassified_errors_follow_the_setting(settings):
    assert classify(ValueError(), noop) == "transient"
    settings.JOBGUARD = {**settings.JOBGUARD, "UNCLASSIFIED_ERRORS": "permanent"}
    assert classify(ValueError(), noop) == "permanent"


def test_a_handler_can_ask_for_a_delay():
    assert requested_delay(TransientError("rate limited", retry_after=42)) == 42
    assert requested_delay(ValueError()) is None
    with pytest.raises(ValueError, match="retry_after"):
        TransientError("x", retry_after=-1)


class BaseProviderError(Exception):
    pass


class ProviderBusy(BaseProviderError):
    pass


def test_the_most_specific_mapping_wins_over_the_order_of_the_options():
    from django_jobguard import task as make_task

    @make_task(name="tests.unit.specific", retry_on=(ProviderBusy,), fatal_on=(BaseProviderError,))
    def handler() -> None: ...

    assert classify(ProviderBusy(), handler) == "transient"
    assert classify(BaseProviderError(), handler) == "permanent"


def test_fatal_on_a_subclass_beats_retry_on_its_base_class():
    from tests.testapp.tasks_dlq import CardDeclined, charge

    assert classify(CardDeclined("declined"), charge) == "permanent"
    assert classify(ValueError("timeout"), charge) == "transient"


def test_a_broad_retry_on_does_not_retry_our_permanent_error():
    from django_jobguard import task as make_task

    @make_task(name="tests.unit.broad", retry_on=(Exception,))
    def handler() -> None: ...

    assert classify(PermanentError("bad payload"), handler) == "permanent"
    assert classify(RecoverableError("degraded"), handler) == "recoverable"
    assert classify(KeyError("x"), handler) == "transient"


def test_unclassified_errors_can_default_to_permanent_without_touching_classified_ones(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "UNCLASSIFIED_ERRORS": "permanent"}
    assert classify(TransientError("x"), noop) == "transient"
    assert classify(ProviderTimeout(), flaky) == "transient"
    assert classify(KeyError("x"), noop) == "permanent"


def test_a_partial_task_schedule_takes_its_other_keys_from_the_queue(settings):
    from django_jobguard import task as make_task
    from django_jobguard.retry import policy_for

    settings.JOBGUARD = {
        **settings.JOBGUARD,
        "QUEUES": {"mail": {"retry": {"base": 2, "max": 40, "jitter": 1}}},
    }

    @make_task(name="tests.unit.partial", retry={"base": 7})
    def handler() -> None: ...

    assert policy_for(handler, "mail", "transient") == RetryPolicy(base=7, max=40, jitter=1)
    # Another queue, the global schedule of the test settings.
    assert policy_for(handler, "default", "transient") == RetryPolicy(base=7, max=7, jitter=0.05)
    assert policy_for(noop, "mail", "transient") == RetryPolicy(base=2, max=40, jitter=1)
    assert policy_for(noop, "mail", "recoverable").base == 0.2  # global recoverable schedule


def test_a_task_schedule_is_validated_when_the_task_is_declared():
    from django_jobguard import task as make_task
    from django_jobguard.exceptions import InvalidTaskError

    with pytest.raises(InvalidTaskError, match=r"\['max'\] \(1\.0\) must not be below base \(10\.0\)"):
        make_task(name="tests.unit.bad_schedule", retry={"base": 10, "max": 1})(lambda: None)
    with pytest.raises(InvalidTaskError, match=r"\['bsae'\] is not a known setting"):
        make_task(name="tests.unit.typo_schedule", retry={"bsae": 10})(lambda: None)


def test_a_requested_delay_wins_over_the_backoff_and_still_gets_jitter():
    from django_jobguard.retry import delay_for

    rng = random.Random(3)
    delays = [
        delay_for(TransientError("429", retry_after=30), noop, "default", "transient", 1, rng)
        for _ in range(200)
    ]
    assert min(delays) >= 30
    assert max(delays) <= 30.05
    assert len({round(d, 4) for d in delays}) > 100  # spread, not all identical


def test_requested_delays_must_be_finite():
    for bad in (float("inf"), float("nan"), -1):
        with pytest.raises(ValueError, match="finite number of seconds"):
            TransientError("x", retry_after=bad)

    class LibraryError(Exception):
        retry_after = float("inf")

    assert requested_delay(LibraryError()) is None


def test_a_subclass_of_task_error_may_declare_its_own_category():
    from django_jobguard.exceptions import TaskError

    class QuotaExhausted(TaskError):
        category = "recoverable"

    class DailyQuotaExhausted(QuotaExhausted):
        pass

    class Declined(TransientError):
        category = "permanent"

    assert classify(QuotaExhausted("quota"), noop) == "recoverable"
    assert classify(DailyQuotaExhausted("quota"), noop) == "recoverable"
    assert classify(Declined("no"), noop) == "permanent"
    assert classify(TaskError("plain"), noop) == "transient"
