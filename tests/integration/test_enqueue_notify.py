"""On PostgreSQL, one enqueueing transaction wakes the idle workers once per queue, not once per row.

Read by a real LISTENing connection, as a worker's listener reads them.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection, transaction

from tests.testapp import tasks

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CHANNEL = "jobguard_jobs"


def _listener() -> psycopg.Connection:
    db = connection.settings_dict
    conn = psycopg.connect(
        dbname=db["NAME"],
        user=db["USER"],
        password=db["PASSWORD"] or None,
        host=db["HOST"],
        port=db["PORT"] or None,
        autocommit=True,
    )
    conn.execute(f"LISTEN {CHANNEL}")
    return conn


def _received(conn: psycopg.Connection, settle: float = 0.5) -> list[str]:
    """The payloads delivered to ``conn`` until none has come for ``settle`` seconds."""
    payloads = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        batch = [n.payload for n in conn.notifies(timeout=settle) if n.channel == CHANNEL]
        if not batch:
            break
        payloads += batch
    return payloads


def test_a_bulk_enqueue_of_many_rows_sends_one_notify():
    with _listener() as listener:
        jobs = tasks.noop.bulk_enqueue(((), {}) for _ in range(200))
        assert len(jobs) == 200
        assert _received(listener) == ["default"]


def test_many_single_enqueues_in_one_transaction_send_one_notify_per_queue():
    with _listener() as listener:
        with transaction.atomic():
            for i in range(50):
                tasks.add.enqueue(i)
            for _ in range(20):
                tasks.slow_record.enqueue(marker="m", seconds=0)
        assert sorted(_received(listener)) == ["default", "slow"]


def test_each_autocommitted_enqueue_sends_its_own_notify():
    # The other side of the two tests above: the listener does see one per transaction.
    with _listener() as listener:
        for i in range(3):
            tasks.add.enqueue(i)
        assert _received(listener) == ["default"] * 3
