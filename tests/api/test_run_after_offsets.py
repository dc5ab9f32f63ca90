"""A ``run_after`` with any UTC offset Python accepts (up to ±23:59) is stored as the instant it
names. PostgreSQL refuses offsets beyond ±15:59 in a timestamp it is sent ("time zone
displacement out of range"): the time once reached it as given, a 500 through the API and an
error from ``enqueue()``. It is converted to UTC before it reaches the database."""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone

from django_jobguard.models import Job
from tests.api.support import BASE, as_user
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

ADD = "tests.testapp.tasks.api_add"

#: Offsets past PostgreSQL's ±15:59, and one inside it, each side.
OFFSETS = ["+23:00", "-20:00", "+23:59", "-23:59", "+16:00", "+15:59"]


def in_a_week_at(offset: str) -> tuple[datetime.datetime, str]:
    """An instant a week ahead (whole seconds) and its ISO 8601 spelling at ``offset``."""
    when = (timezone.now() + datetime.timedelta(days=7)).replace(microsecond=0)
    sign = 1 if offset[0] == "+" else -1
    hours, minutes = (int(part) for part in offset[1:].split(":"))
    zone = datetime.timezone(sign * datetime.timedelta(hours=hours, minutes=minutes))
    return when, when.astimezone(zone).isoformat()


@pytest.mark.parametrize("offset", OFFSETS)
def test_the_api_stores_a_run_after_of_any_offset_as_its_instant(offset):
    client, _ = as_user("producer", "add_job")
    when, text = in_a_week_at(offset)
    assert text.endswith(offset)
    response = client.post(BASE + "jobs/", {"task": ADD, "args": [1], "run_after": text}, format="json")
    assert response.status_code == 201, response.content
    assert Job.objects.get().run_after == when
    # The same request again (an idempotent repeat) finds the job it made, at that instant.
    again = client.post(
        BASE + "jobs/",
        {"task": ADD, "args": [1], "run_after": text},
        format="json",
        headers={"Idempotency-Key": f"k{offset}"},
    )
    assert again.status_code == 201, again.content
    repeat = client.post(
        BASE + "jobs/",
        {"task": ADD, "args": [1], "run_after": text},
        format="json",
        headers={"Idempotency-Key": f"k{offset}"},
    )
    assert repeat.status_code == 200, repeat.content
    assert repeat.json()["id"] == again.json()["id"]


@pytest.mark.parametrize("offset", OFFSETS)
def test_enqueue_stores_a_run_after_of_any_offset_as_its_instant(offset):
    when, text = in_a_week_at(offset)
    run_after = datetime.datetime.fromisoformat(text)
    job = tasks.add.using(run_after=run_after).enqueue(1, 2)
    assert Job.objects.get(pk=job.pk).run_after == when
    # With a key too: the repeat compares the instant.
    keyed = tasks.add.using(run_after=run_after, idempotency_key=f"offset{offset}")
    first = keyed.enqueue(3, 4)
    assert keyed.enqueue(3, 4).pk == first.pk
    assert Job.objects.get(pk=first.pk).run_after == when
