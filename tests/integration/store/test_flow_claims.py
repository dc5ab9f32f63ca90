"""The SQL stores' limited claim: what it leaves committed, and its hot-key read hint.

Not part of the store contract (tests/store_contract/test_flow.py holds what every store's
limited claim admits): a closed connection and the hint kept in ``flow.hot_keys`` are the
database stores' own. Runs on SQLite by default and on PostgreSQL or MariaDB with
``JOBGUARD_TEST_DATABASE_URL``.
"""

import time

import pytest
from django.db import connection

from django_jobguard import store
from django_jobguard.flow import hot_keys
from django_jobguard.models import FlowRate, Job
from django_jobguard.registry import registry
from tests.testapp import tasks_flow

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("claims_start_from_the_head"),
]


def claim(batch_size=10, queues=None):
    return store.claim("default", queues, batch_size, "test-worker", flow=registry.flow_plan())


def test_a_limited_claim_outside_a_transaction_commits_its_leases_and_rates(flow_tasks):
    rated = [tasks_flow.rated.enqueue(n) for n in range(2)]
    keyed = tasks_flow.per_account.enqueue(1, 0)
    claimed = claim()
    assert sorted(job.id for job in claimed) == sorted([*(job.id for job in rated), keyed.id])
    assert not connection.in_atomic_block
    connection.close()  # anything left uncommitted would be rolled back here
    assert set(Job.objects.values_list("status", flat=True)) == {"running"}
    assert FlowRate.objects.filter(key="rate:task:tests.testapp.tasks_flow.rated").exists()
    assert claim() == []  # the connection serves the next claim as usual


def test_a_claim_that_finds_a_key_full_remembers_it_as_hot(flow_tasks):
    hot = tasks_flow.per_account.bulk_enqueue(((1, 0), {}) for _ in range(200))
    first = claim(batch_size=3)  # two slots: the third job read finds the key full
    assert [job.id for job in first] == [job.id for job in hot[:2]]
    assert hot_keys.recent(time.monotonic()) == ["c:tests.testapp.tasks_flow.per_account|account:1"]
