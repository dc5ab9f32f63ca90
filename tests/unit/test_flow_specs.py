"""Flow-control specs are refused when declared, never inside a worker: @task options,
Limit and Rate, JOBGUARD["LIMITS"] and a queue's concurrency, and the system check."""

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_jobguard import Limit, Rate, task
from django_jobguard.checks.settings import check_settings
from django_jobguard.checks.tasks import check_task_limits, check_unused_breakers
from django_jobguard.conf import BreakerSpec, RetryBudgetSpec, parse
from django_jobguard.exceptions import InvalidTaskError
from django_jobguard.flow import parse_rate
from django_jobguard.registry import registry


def handler(account_id: int, partner_id: int = 0) -> None:
    pass


def declare(**options):
    return task(name="tests.flow_specs.handler", **options)(handler)


@pytest.fixture(autouse=True)
def forget_the_task():
    yield
    registry.unregister("tests.flow_specs.handler")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100/m", (100, 60.0)),
        ("10/s", (10, 1.0)),
        ("5/h", (5, 3600.0)),
        ("30/10s", (30, 10.0)),
        (" 2 / minute ", (2, 60.0)),
    ],
)
def test_rates_read_as_jobs_per_period(text, expected):
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("fast", "cannot read the rate 'fast': write it as '<jobs>/<unit>', e.g. '100/m' or '10/s'"),
        ("0/s", "must allow at least one job in a period longer than 0"),
        ("-5/s", "cannot read the rate '-5/s'"),
        ("10/0s", "must allow at least one job"),
        ("10/fortnight", "has an unknown unit 'fortnight'; units: s, m, h, d"),
        (10, "rate must be a string such as '100/m' or a Rate(...), not 10."),
    ],
)
def test_bad_rates_are_refused_at_import_with_what_is_wrong(value, message):
    with pytest.raises(InvalidTaskError, match="rate") as info:
        declare(rate=value)
    assert message in str(info.value)
    assert "tests.flow_specs.handler" not in registry


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "3"])
def test_concurrency_must_be_a_whole_number_of_at_least_one(value):
    with pytest.raises(InvalidTaskError, match="concurrency must be a whole number of at least 1"):
        declare(concurrency=value)


def test_limit_and_rate_refuse_zero_negative_and_empty_keys():
    with pytest.raises(InvalidTaskError, match=r"Limit\(n\) must be a whole number of at least 1, not 0"):
        Limit(0)
    with pytest.raises(InvalidTaskError, match=r"Rate\(burst\) must be a whole number of at least 1, not -2"):
        Rate("10/s", burst=-2)
    with pytest.raises(InvalidTaskError, match="Limit key must be a non-empty template"):
        Limit(1, key="")
    with pytest.raises(InvalidTaskError, match="names no argument, so every job would share one key"):
        Rate("10/s", key="partner")


def test_a_key_template_naming_another_argument_is_refused():
    with pytest.raises(
        InvalidTaskError,
        match=r"concurrency key template 'account:\{acount_id\}' names 'acount_id', which is not a parameter "
        r"of tests.flow_specs.handler; parameters: account_id, partner_id",
    ):
        declare(concurrency=Limit(1, key="account:{acount_id}"))
    with pytest.raises(InvalidTaskError, match=r"rate key template 'p:\{partner\}' names 'partner'"):
        declare(rate=Rate("1/s", key="p:{partner}"))


def test_a_limit_name_must_be_a_non_empty_string():
    with pytest.raises(InvalidTaskError, match="limit must name an entry of JOBGUARD\\['LIMITS'\\]"):
        declare(limit="")


def test_valid_specs_are_kept_on_the_task():
    declared = declare(concurrency=Limit(1, key="account:{account_id}"), rate="100/m", limit="stripe")
    assert declared.concurrency == Limit(1, key="account:{account_id}")
    assert declared.rate == Rate("100/m")
    assert declared.rate.interval == pytest.approx(0.6)
    assert declared.rate.burst_size == 2  # one second's worth, rounded up
    assert Rate("25/s").burst_size == 25
    assert Rate("25/s", burst=3).burst_size == 3
    assert declared.limited


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (
            {"stripe": {"rate": "fast"}},
            "JOBGUARD['LIMITS']['stripe']['rate'] is not a rate: cannot read the rate 'fast'",
        ),
        (
            {"stripe": {"concurrency": 0}},
            "JOBGUARD['LIMITS']['stripe']['concurrency'] must be an integer of at least 1",
        ),
        ({"stripe": {}}, "JOBGUARD['LIMITS']['stripe'] needs a 'rate' (such as '25/s'), a 'concurrency'"),
        (
            {"stripe": {"burst": 3, "concurrency": 1}},
            "JOBGUARD['LIMITS']['stripe']['burst'] is set without a 'rate'",
        ),
        (
            {"stripe": {"rate": "1/s", "burst": 0}},
            "JOBGUARD['LIMITS']['stripe']['burst'] must be an integer of at least 1",
        ),
        ({"stripe": {"rates": "1/s"}}, "JOBGUARD['LIMITS']['stripe']"),
    ],
)
def test_bad_limits_settings_name_the_full_key(limits, message):
    with pytest.raises(ImproperlyConfigured) as info:
        parse({"LIMITS": limits})
    assert message in str(info.value)


def test_a_queue_concurrency_is_a_positive_integer():
    assert parse({"QUEUES": {"q": {"concurrency": 3}}}).queue("q").concurrency == 3
    assert parse({"QUEUES": {"q": {}}}).queue("q").concurrency is None
    with pytest.raises(
        ImproperlyConfigured, match=r"JOBGUARD\['QUEUES'\]\['q'\]\['concurrency'\] must be an integer"
    ):
        parse({"QUEUES": {"q": {"concurrency": -1}}})


def test_the_check_refuses_an_undeclared_limit_name():
    declare(limit="strpie")
    with override_settings(JOBGUARD={"LIMITS": {"stripe": {"rate": "25/s", "concurrency": 10}}}):
        messages = check_task_limits()
    assert [(m.id, m.msg) for m in messages] == [
        (
            "jobguard.E031",
            "Task tests.flow_specs.handler has limit='strpie', which JOBGUARD['LIMITS'] does not declare.",
        )
    ]
    assert "declared limits: stripe" in messages[0].hint
    with override_settings(JOBGUARD={"LIMITS": {"strpie": {"concurrency": 1}}}):
        assert check_task_limits() == []


def test_a_breaker_and_a_budget_take_their_defaults_or_the_options_given():
    limits = parse(
        {
            "LIMITS": {
                "stripe": {"rate": "25/s", "breaker": True, "retry_budget": True},
                "mail": {"breaker": {"min_calls": 50, "open_for": 10}, "retry_budget": {"ratio": 0.1}},
            }
        }
    ).limits
    assert limits["stripe"].breaker == BreakerSpec(0.5, 20, 60.0, 30.0, 5)
    assert limits["stripe"].retry_budget == RetryBudgetSpec(0.2, 10, 60.0)
    assert limits["mail"].breaker == BreakerSpec(0.5, 50, 60.0, 10.0, 5)
    assert limits["mail"].retry_budget == RetryBudgetSpec(0.1, 10, 60.0)
    assert limits["mail"].rate is None and limits["mail"].concurrency is None
    assert RetryBudgetSpec(0.2, 10, 60.0).allowed(1000) == 200
    assert RetryBudgetSpec(0.2, 10, 60.0).allowed(3) == 10


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"breaker": {"failure_rate": 0}},
            "['breaker']['failure_rate'] must be a fraction from above 0 to 1",
        ),
        ({"breaker": {"failure_rate": 1.5}}, "['breaker']['failure_rate'] must be a fraction"),
        ({"breaker": {"min_calls": 0}}, "['breaker']['min_calls'] must be an integer of at least 1"),
        ({"breaker": {"probes": 1.5}}, "['breaker']['probes'] must be an integer of at least 1"),
        ({"breaker": {"open_for": 0}}, "['breaker']['open_for'] must be more than 0"),
        ({"breaker": {"window": "1m"}}, "['breaker']['window'] must be a number of seconds"),
        ({"breaker": {"threshold": 0.5}}, "['breaker']['threshold'] is not a known setting"),
        ({"breaker": "on"}, "['breaker'] must be a dict"),
        ({"retry_budget": {"ratio": 2}}, "['retry_budget']['ratio'] must be a fraction from 0 to 1"),
        (
            {"retry_budget": {"min_retries": -1}},
            "['retry_budget']['min_retries'] must be an integer of at least 0",
        ),
    ],
)
def test_bad_breaker_and_budget_specs_are_refused_by_the_settings_check(spec, message):
    with override_settings(JOBGUARD={"LIMITS": {"stripe": spec}}):
        (error,) = check_settings()
    assert error.id == "jobguard.E001"
    assert f"JOBGUARD['LIMITS']['stripe']{message}" in error.msg


def test_the_check_warns_of_a_breaker_no_task_names():
    declare(limit="stripe")
    limits = {
        "stripe": {"breaker": True},
        "mail": {"breaker": True, "retry_budget": True},
        "s3": {"rate": "5/s"},
    }
    with override_settings(JOBGUARD={"LIMITS": limits}):
        messages = check_unused_breakers()
    assert [(m.id, m.msg) for m in messages] == [
        (
            "jobguard.W033",
            "JOBGUARD['LIMITS']['mail'] declares a breaker and a retry budget, but no task names it "
            "with limit='mail' and no outbox destination with 'LIMIT': it guards nothing.",
        )
    ]
