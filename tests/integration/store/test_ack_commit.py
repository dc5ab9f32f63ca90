"""The fenced ack that ends an atomic block sends that block's COMMIT with it (PostgreSQL).

One round trip instead of two, and a lease lost by then must still commit nothing: the
ack's statement fails and PostgreSQL skips the COMMIT behind it.
"""

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_jobguard import store
from django_jobguard.models import Job
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def claimed_job():
    tasks.add.enqueue(1)
    (job,) = store.claim("default", None, 1, "test-worker")
    return job


def transaction_status():
    from psycopg.pq import TransactionStatus

    return TransactionStatus(connection.connection.info.transaction_status)


def another_connection(**options):
    """A second connection to the test database (the settings' NAME is not the test one)."""
    settings = connections["default"].settings_dict
    options = {**settings["OPTIONS"], **options}
    return type(connections["default"])({**settings, "OPTIONS": options}, alias="default")


def status_seen_by_another_connection(job_id):
    other = another_connection()
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SELECT status FROM {Job._meta.db_table} WHERE id = %s", [job_id])
            return cursor.fetchone()[0]
    finally:
        other.close()


def test_an_ack_that_ends_its_block_commits_the_block_in_the_same_round_trip():
    job = claimed_job()
    committed = []
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        Execution.objects.create(marker="with-ack", job_id=job.id)
        transaction.on_commit(lambda: committed.append(job.id))
        assert store.complete("default", job.id, job.lease_token, "7", commit=True)
        # Committed already: another connection sees it, and no transaction is open.
        assert transaction_status().name == "IDLE"
        assert status_seen_by_another_connection(job.id) == "succeeded"
        assert committed == []  # the block's callbacks run as it exits, as always
    assert committed == [job.id]
    # The ack's statement carried the COMMIT; the "COMMIT" Django logs as the block exits is
    # its own note of the call, which psycopg answers without sending anything (no transaction).
    sent = [query["sql"] for query in queries.captured_queries]
    assert [sql for sql in sent if sql.endswith("; COMMIT")] == [sent[-2]]
    assert Job.objects.get(pk=job.id).result == 7
    assert Execution.objects.filter(marker="with-ack").count() == 1


class Refused(Exception):
    pass


def test_a_refused_ack_that_ends_its_block_commits_nothing_of_it():
    job = claimed_job()
    with pytest.raises(Refused), transaction.atomic():
        Execution.objects.create(marker="stale", job_id=job.id)
        # Another worker's token: the lease is not ours, as after a reap and a new claim.
        assert not store.complete("default", job.id, "0" * 32, "7", commit=True)
        assert transaction_status().name == "INERROR"  # the COMMIT behind it did not run
        raise Refused  # what write_ack does (LeaseLost), so the block rolls back
    assert not Execution.objects.filter(marker="stale").exists()
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.lease_token) == ("running", job.lease_token)
    # The connection is usable again at once.
    assert store.complete("default", job.id, job.lease_token, "8")


def test_inside_a_callers_transaction_the_ack_leaves_the_commit_to_it():
    job = claimed_job()
    with pytest.raises(Refused), transaction.atomic():
        with transaction.atomic():
            assert store.complete("default", job.id, job.lease_token, "7", commit=True)
            assert transaction_status().name == "INTRANS"
        raise Refused  # the outer block rolls back, and the ack with it
    assert Job.objects.get(pk=job.id).status == "running"


def test_with_server_side_binding_the_ack_leaves_the_commit_to_the_block():
    # Two statements with parameters in one string need the simple-query protocol, which
    # psycopg's server-side binding cursors do not use.
    server_binding = another_connection(server_side_binding=True)
    job = claimed_job()
    original = connections["default"]
    connections["default"] = server_binding
    try:
        with transaction.atomic():
            assert store.complete("default", job.id, job.lease_token, "7", commit=True)
            assert server_binding.connection.info.transaction_status.name == "INTRANS"
        assert Job.objects.get(pk=job.id).status == "succeeded"
    finally:
        connections["default"] = original
        server_binding.close()
