"""POST jobs/: a flow-control key made from what the caller sends is 400 when it cannot be stored."""

from __future__ import annotations

import pytest

from django_jobguard import Limit, Rate, task
from django_jobguard.flow import hot_keys
from django_jobguard.models import Job
from django_jobguard.registry import registry
from tests.api.support import BASE, as_user

pytestmark = pytest.mark.django_db

JOBS = BASE + "jobs/"
#: 60 characters: the claim stores the rate key as r:<task>|<key>, 63 characters before the key.
NAME = "tests.api.test_enqueue_limit_keys.partner_call" + "_" * 14


@pytest.fixture
def producer():
    client, _ = as_user("producer", "add_job")
    return client


@pytest.fixture
def partner_call():
    hot_keys.clear()

    def partner_call(partner: str) -> None:
        """Calls a partner's API: at most one a second, and two at once, per partner."""

    declared = task(
        name=NAME,
        api=True,
        queue_name="flow-api",
        rate=Rate("1/s", key="partner:{partner}"),
        concurrency=Limit(2, key="partner:{partner}"),
    )(partner_call)
    yield declared
    registry.unregister(declared.name)


def test_a_rate_key_that_would_not_fit_its_column_is_400_naming_the_arguments(producer, partner_call):
    # Before, a key of 200 characters passed (the per-key limit) and every claim of the queue
    # then failed on PostgreSQL and MariaDB: r:<task>|<key> is 263 characters, over 255.
    partner = "p" * (200 - len("partner:"))
    response = producer.post(JOBS, {"task": NAME, "kwargs": {"partner": partner}}, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert errors["args"] == errors["kwargs"]
    message = " ".join(errors["kwargs"])
    assert "limit key template 'partner:{partner}' gave a key of 200 characters" in message
    assert "1 to 192 characters" in message and "255" in message
    assert Job.objects.count() == 0


def test_the_longest_rate_key_that_fits_is_accepted_and_stored_intact(producer, partner_call):
    partner = "p" * (192 - len("partner:"))
    response = producer.post(JOBS, {"task": NAME, "kwargs": {"partner": partner}}, format="json")
    assert response.status_code == 201, response.content
    assert sorted(Job.objects.get().flow_keys) == [
        f"c:{NAME}|partner:{partner}",
        f"r:{NAME}|partner:{partner}",
    ]
