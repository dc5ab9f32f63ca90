"""A NUL character in any console filter is refused with 400, never a server error."""

import pytest

from tests.support.factories import force_login, make_superuser
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

PAGES = [
    "/admin/jobguard/job/",
    "/admin/jobguard/deadletter/",
    "/admin/jobguard/queueevent/",
    "/admin/jobguard/queuestate/",
    "/admin/jobguard/workerbeat/",
    "/admin/jobguard/lock/",
    "/admin/jobguard/idempotencykey/",
]


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("query", ["queue_name=%00", "q=a%00b", "status=%00", "%00=1"])
def test_a_nul_in_a_filter_is_a_400(client, page, query):
    tasks.add.enqueue(1)
    client.force_login(make_superuser())
    response = client.get(f"{page}?{query}")
    assert response.status_code == 400, (page, query, response.status_code)
    assert client.get(page).status_code == 200


# -- the console's forms: a NUL in a reason or a name is refused with the service's message ----------


def _operator(client):
    force_login(client, "operator", "view_job", "pause_queue", "operate_breaker")
    return client


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"queue": "default", "reason": "db\x00slow"}, "A reason may not hold a NUL character"),
        ({"queue": "def\x00ault", "reason": "db slow"}, "holds a NUL character"),
    ],
)
def test_a_nul_in_a_pause_is_refused_with_a_message_and_nothing_written(client, fields, says):
    from django_jobguard.models import QueueEvent, QueueState

    response = _operator(client).post("/admin/jobguard/queuestate/pause/", fields, follow=True)
    assert response.status_code == 200
    assert says in response.content.decode()
    assert not QueueState.objects.exists() and not QueueEvent.objects.exists()


@pytest.mark.parametrize("view", ["open", "close"])
def test_a_nul_in_a_breaker_reason_is_refused_with_a_message_and_nothing_written(client, view):
    from django_jobguard.models import BreakerEvent

    response = _operator(client).post(
        f"/admin/jobguard/breaker/{view}/", {"limit": "flow-dep", "reason": "down\x00"}, follow=True
    )
    assert response.status_code == 200
    assert "A reason may not hold a NUL character" in response.content.decode()
    assert not BreakerEvent.objects.exists()


def test_the_services_refuse_a_nul_in_a_reason_whoever_calls_them():
    from django_jobguard import breakers
    from django_jobguard.exceptions import BreakerError, QueueError
    from django_jobguard.operations import queues

    with pytest.raises(QueueError, match="NUL"):
        queues.pause("default", actor="cli", reason="a\x00b")
    with pytest.raises(QueueError, match="NUL"):
        queues.resume("default", actor="cli", reason="a\x00b")
    with pytest.raises(BreakerError, match="NUL"):
        breakers.open_breaker("flow-dep", actor="cli", reason="a\x00b")
