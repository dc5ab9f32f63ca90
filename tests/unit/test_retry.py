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
