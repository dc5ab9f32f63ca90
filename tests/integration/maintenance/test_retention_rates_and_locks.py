"""The retention pass prunes idle flow-control rate rows and released lock rows.

The pass deletes through the ORM (``maintenance.retention``), so it runs on the database only:
the in-memory store prunes its lock rows with ``prune_locks`` (tests/store_contract/test_locks.py)
and keeps its rates in ``arrivals`` (docs/reference/memory-store.md).
"""

import datetime
import io

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_jobguard.maintenance import retention
from django_jobguard.models import FlowRate, Lock
from django_jobguard.store import locks

pytestmark = pytest.mark.django_db

A = "a" * 32


def test_prune_deletes_only_rate_keys_idle_for_an_hour():
    now = timezone.now().timestamp()
    FlowRate.objects.create(key="rate:task:idle", tat=now - 7200)
    FlowRate.objects.create(key="rate:task:recent", tat=now - 60)
    FlowRate.objects.create(key="rate:task:busy", tat=now + 5)
    assert retention.prune(dry_run=True).flow_rates == 1
    assert retention.prune().flow_rates == 1
    assert sorted(FlowRate.objects.values_list("key", flat=True)) == ["rate:task:busy", "rate:task:recent"]
    FlowRate.objects.create(key="rate:task:idle", tat=now - 7200)
    out = io.StringIO()
    call_command("jobguard_prune", stdout=out)
    assert "Deleted 1 idle flow-control rate row(s)." in out.getvalue().splitlines()


def test_the_retention_pass_prunes_released_lock_rows():
    locks.acquire("default", "k", A, 30)
    locks.release("default", "k", A)
    aged = timezone.now() - retention.LOCK_ROWS_KEPT_FOR - datetime.timedelta(minutes=1)
    Lock.objects.filter(key="k").update(acquired_at=aged)
    assert retention.prune(dry_run=True).locks == 1
    assert retention.prune().locks == 1
    assert not Lock.objects.exists()
