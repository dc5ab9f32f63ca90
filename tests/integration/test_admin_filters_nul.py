"""A NUL character in any console filter is refused with 400, never a server error."""

import pytest
from django.contrib.auth.models import User

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
    client.force_login(User.objects.create_superuser("root"))
    response = client.get(f"{page}?{query}")
    assert response.status_code == 400, (page, query, response.status_code)
    assert client.get(page).status_code == 200
