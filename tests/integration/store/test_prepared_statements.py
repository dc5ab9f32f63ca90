"""The worker's per-job statements are prepared once per connection (PostgreSQL).

PostgreSQL parses and plans a statement sent as text on every run; the ack, the batch ack
and the lease renewal run for every job, so each connection prepares them on first use and
sends ``EXECUTE`` after that.
"""

import logging
import re

import pytest
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_jobguard import store
from django_jobguard.models import Job
from django_jobguard.store import postgres
from tests.testapp import tasks

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def claimed(n):
    for i in range(n):
        tasks.add.enqueue(i)
    return store.claim("default", None, n, "test-worker")


def prepared_here():
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'jobguard%%' ORDER BY name")
        return [row[0] for row in cursor.fetchall()]


def sent(queries):
    """(verb, statement name) of each statement sent: ("UPDATE", None) for plain text."""
    shapes = []
    for query in queries.captured_queries:
        match = re.match(r"(PREPARE|EXECUTE) (jobguard_\w+)", query["sql"])
        shapes.append((match[1], match[2]) if match else (query["sql"].split(" ", 1)[0], None))
    return shapes


def statuses(jobs):
    return sorted(Job.objects.filter(pk__in=[job.id for job in jobs]).values_list("status", flat=True))


def test_the_ack_is_prepared_on_its_first_run_on_a_connection_and_executed_after():
    jobs = claimed(3)
    connection.close()  # a new connection, which has prepared nothing
    with CaptureQueriesContext(connection) as queries:
        for job in jobs:
            assert store.complete("default", job.id, job.lease_token, "7")
    (name,) = prepared_here()
    assert sent(queries) == [("PREPARE", name)] + [("EXECUTE", name)] * 3
    assert statuses(jobs) == ["succeeded"] * 3
    assert Job.objects.get(pk=jobs[0].id).result == 7
    # The fencing is the statement's own: another worker's token still matches nothing.
    (other,) = claimed(1)
    assert not store.complete("default", other.id, "0" * 32, "7")
    assert Job.objects.get(pk=other.id).status == "running"


def test_a_batch_ack_and_a_lease_renewal_are_prepared_too():
    jobs = claimed(4)
    connection.close()
    leases = [(job.id, job.lease_token) for job in jobs]
    with CaptureQueriesContext(connection) as queries:
        for _ in range(2):
            assert store.heartbeat("default", leases) == {job.id for job in jobs}
        acked = store.complete_many("default", [(job.id, job.lease_token, "1") for job in jobs])
    assert acked.keys() == {job.id for job in jobs}
    assert [verb for verb, _ in sent(queries)] == ["PREPARE", "EXECUTE", "EXECUTE", "PREPARE", "EXECUTE"]
    assert len(prepared_here()) == 2
    assert statuses(jobs) == ["succeeded"] * 4


@pytest.fixture(autouse=True)
def _no_pooler_detected_yet():
    # Detection lasts for the life of the process: each test starts without it.
    postgres._detected_pooled.clear()
    yield
    postgres._detected_pooled.clear()


def pooler_warnings(caplog):
    return [
        record
        for record in caplog.records
        if record.levelno == logging.WARNING and "POOLED_DATABASES" in record.getMessage()
    ]


def test_statements_that_vanish_under_a_connection_mark_the_alias_pooled_and_text_is_sent(caplog):
    first, second, third = claimed(3)
    assert store.complete("default", first.id, first.lease_token, "1")
    assert len(prepared_here()) == 1
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # what a transaction-mode pooler's other session looks like
    # Outside a transaction nothing is lost: it runs again, as text, and the alias is marked.
    assert store.complete("default", second.id, second.lease_token, "2")
    assert postgres.detected_pooled_databases() == {"default"}
    with CaptureQueriesContext(connection) as queries:
        assert store.complete("default", third.id, third.lease_token, "3")
    assert sent(queries) == [("UPDATE", None)]
    assert prepared_here() == []
    (warning,) = pooler_warnings(caplog)
    assert "alias=default" in warning.getMessage()
    assert statuses([first, second, third]) == ["succeeded"] * 3


def test_inside_a_transaction_the_lost_statement_fails_once_and_text_is_sent_after(caplog):
    first, second = claimed(2)
    assert store.complete("default", first.id, first.lease_token, "1")
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    # The failed statement aborted the transaction: the caller sees the error (a job's ack:
    # the job runs again), and every statement after it on this alias is text.
    with pytest.raises(DatabaseError, match="does not exist"), transaction.atomic():
        store.complete("default", second.id, second.lease_token, "2")
    assert Job.objects.get(pk=second.id).status == "running"
    assert store.complete("default", second.id, second.lease_token, "2")
    assert len(pooler_warnings(caplog)) == 1
    assert statuses([first, second]) == ["succeeded"] * 2


def test_a_whole_transaction_of_ours_runs_again_after_its_statement_is_lost_with_one_warning(caplog):
    # A worker's batched ack is one transaction of ours (store.retrying): when its prepared
    # statement was lost, it runs again, as text, instead of failing to its one-by-one path
    # with a second warning and a traceback.
    from django_jobguard import events

    first, second, third = claimed(3)
    assert store.complete_many("default", [(first.id, first.lease_token, "1")]) == {first.id: False}
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    retried = []
    sink = retried.append
    events.add_sink(sink)
    try:

        def ack_batch():
            with transaction.atomic():
                return store.complete_many(
                    "default", [(second.id, second.lease_token, "2"), (third.id, third.lease_token, "3")]
                )

        assert set(store.retrying("default", "ack_batch", ack_batch)) == {second.id, third.id}
    finally:
        events.remove_sink(sink)
    assert [(e.operation, e.reason) for e in retried if isinstance(e, events.StatementRetried)] == [
        ("ack_batch", "prepared_statement_lost")
    ]
    assert len(pooler_warnings(caplog)) == 1
    assert statuses([first, second, third]) == ["succeeded"] * 3


def test_a_name_another_client_prepared_on_the_session_marks_the_alias_pooled(caplog):
    # Behind a pooler a server session may already hold a name another client prepared:
    # PREPARE then fails with "already exists" (42P05).
    (job,) = claimed(1)
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute(f"PREPARE {postgres._COMPLETE._name}_0 AS SELECT 1")
    assert store.complete("default", job.id, job.lease_token, "7")
    assert postgres.detected_pooled_databases() == {"default"}
    (warning,) = pooler_warnings(caplog)
    assert "already exists" in warning.getMessage()
    assert statuses([job]) == ["succeeded"]


def test_behind_a_transaction_mode_pooler_statements_are_sent_as_text():
    # A pooler gives each transaction whichever server connection is free: a statement
    # prepared on one would be missing on the next.
    jobs = claimed(2)
    connection.close()
    with override_settings(JOBGUARD={**settings.JOBGUARD, "POOLED_DATABASES": ["default"]}):
        with CaptureQueriesContext(connection) as queries:
            for job in jobs:
                assert store.complete("default", job.id, job.lease_token, "7")
    assert sent(queries) == [("UPDATE", None)] * 2
    assert prepared_here() == []
    assert statuses(jobs) == ["succeeded"] * 2
