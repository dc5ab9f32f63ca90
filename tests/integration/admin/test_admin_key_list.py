"""The idempotency keys' list renders each row's job without a query per row."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.support.factories import make_superuser
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

URL = "/admin/jobguard/idempotencykey/"


def queries_for(client) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(URL)
    assert response.status_code == 200
    return len(ctx.captured_queries)


def test_the_key_list_costs_the_same_queries_for_two_keys_or_twenty(client):
    client.force_login(make_superuser("keys"))
    for n in range(2):
        tasks.api_charge.enqueue(order_id=n)
    few = queries_for(client)
    for n in range(2, 20):
        tasks.api_charge.enqueue(order_id=n)
    assert queries_for(client) == few
