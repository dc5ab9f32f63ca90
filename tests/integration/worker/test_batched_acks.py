"""Batched acks: the completer writes the acks of non-atomic tasks together, one commit per batch.

The pipeline and the completer are called directly on real rows; the worker's own ack thread
(and what a crash in its window means) is proved with real processes in
tests/processes/test_batched_acks.py.
"""

import logging
import threading
import time

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext
from prometheus_client import REGISTRY

from django_jobguard import signals, store
from django_jobguard.models import IdempotencyKey, Job
from django_jobguard.outcome import HeldState, Succeeded
from django_jobguard.worker import pipeline
from django_jobguard.worker.completer import Completer
from django_jobguard.worker.held import Held
from tests.conftest import statuses, wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

ALIAS = "default"
WORKER_ID = "batched-acks-test"


def claim(count: int) -> list[Held]:
    jobs = store.claim(ALIAS, None, count, WORKER_ID)
    assert len(jobs) == count
    now = time.monotonic()
    return [Held(job=job, renewed_at=now, state=HeldState.RUNNING, started_at=now) for job in jobs]


def batching_runtime() -> pipeline.Runtime:
    completer = Completer(ALIAS, WORKER_ID, ack_window=0.005, ack_batch_size=100)
    return pipeline.Runtime(ALIAS, WORKER_ID, completer)


def lost_leases(job: Job) -> float:
    labels = {"queue": job.queue_name, "task": job.task_name, "operation": "ack"}
    return REGISTRY.get_sample_value("jobguard_lease_lost_total", labels) or 0.0


def test_the_handler_returns_before_its_ack_which_a_batch_then_writes_in_one_statement():
    jobs = [tasks.add.enqueue(n, b=1) for n in range(5)]
    rt = batching_runtime()
    settled = [(held, pipeline.run(held, rt)) for held in claim(5)]
    # Every handler ran, and no ack is written yet: the rows are still leased.
    assert all(type(o) is Succeeded and o.ack_json is not None for _, o in settled)
    assert statuses(jobs) == ["running"] * 5

    succeeded: list[int] = []

    def on_success(sender, job_id, **kwargs):
        succeeded.append(job_id)

    signals.job_succeeded.connect(on_success)
    try:
        with CaptureQueriesContext(connections[ALIAS]) as queries:
            rt.completer.settle_many(settled)
    finally:
        signals.job_succeeded.disconnect(on_success)

    assert statuses(jobs) == ["succeeded"] * 5
    assert sorted(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("result", flat=True)) == [
        1,
        2,
        3,
        4,
        5,
    ]
    assert sorted(succeeded) == sorted(j.pk for j in jobs)
    assert rt.completer.outcomes["succeeded"] == 5
    # On PostgreSQL the ack is a prepared statement: its first run sends PREPARE, then EXECUTE.
    updates = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].lstrip().upper().startswith(("UPDATE", "EXECUTE"))
    ]
    if connections[ALIAS].vendor in ("postgresql", "mysql"):
        assert len(updates) == 1, updates  # one statement for the batch
    else:
        assert len(updates) == 5, updates  # one per row, in one transaction (one commit)
    assert not any("SAVEPOINT" in q["sql"] for q in queries.captured_queries)


def test_a_lost_lease_in_a_batch_costs_that_job_alone(caplog):
    caplog.set_level(logging.WARNING, logger="django_jobguard.worker")
    jobs = [tasks.add.enqueue(n) for n in range(3)]
    rt = batching_runtime()
    settled = [(held, pipeline.run(held, rt)) for held in claim(3)]
    lost = settled[1][0].job.id
    # The lease moved on (another worker's claim after a reap) while the ack waited.
    Job.objects.filter(pk=lost).update(lease_token="someone-else")  # noqa: S106 - a stale token
    before = lost_leases(jobs[0])

    rt.completer.settle_many(settled)

    by_id = {j.pk: s for j, s in zip(jobs, statuses(jobs), strict=True)}
    assert by_id.pop(lost) == "running"
    assert set(by_id.values()) == {"succeeded"}
    assert Job.objects.get(pk=lost).lease_token == "someone-else"  # noqa: S105 - untouched
    assert lost_leases(jobs[0]) == before + 1
    assert [r for r in caplog.records if r.getMessage().startswith(f"ack_rejected job_id={lost};")]
    assert rt.completer.outcomes["succeeded"] == 2


def test_a_keyed_job_in_a_batch_marks_its_key_only_when_its_ack_is_written():
    kept = tasks.add.using(idempotency_key="batch:kept").enqueue(1, b=1)
    lost = tasks.add.using(idempotency_key="batch:lost").enqueue(2, b=2)
    rt = batching_runtime()
    settled = [(held, pipeline.run(held, rt)) for held in claim(2)]
    Job.objects.filter(pk=lost.pk).update(lease_token="someone-else")  # noqa: S106 - a stale token

    rt.completer.settle_many(settled)

    assert statuses([kept, lost]) == ["succeeded", "running"]
    kept_key = IdempotencyKey.objects.get(key="batch:kept")
    assert (kept_key.status, kept_key.result, kept_key.job_id) == ("succeeded", 2, kept.pk)
    assert IdempotencyKey.objects.get(key="batch:lost").status == "in_progress"


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_a_batch_opens_a_transaction_only_for_what_must_commit_with_its_acks(keyed):
    for n in range(3):
        task = tasks.add.using(idempotency_key=f"alone:{n}") if keyed else tasks.add
        task.enqueue(n, b=1)
    rt = batching_runtime()
    settled = [(held, pipeline.run(held, rt)) for held in claim(3)]
    connection = connections[ALIAS]
    in_transaction: list[bool] = []

    def note(execute, sql, params, many, context):
        if "jobguard_job" in sql and "succeeded" in sql:
            in_transaction.append(connection.in_atomic_block)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(note):
        rt.completer.settle_many(settled)

    assert Job.objects.filter(status="succeeded").count() == 3
    assert in_transaction, "the ack statements were not seen"
    # Plain acks on PostgreSQL are one statement with nothing to commit beside it. MariaDB's
    # batch opens a transaction of its own; SQLite's writes a row per statement, made one sync.
    alone = not keyed and connection.vendor == "postgresql"
    assert set(in_transaction) == {not alone}


def test_atomic_tasks_are_never_batched():
    job = tasks.record.enqueue("atomic-batch")
    rt = batching_runtime()
    [held] = claim(1)
    outcome = pipeline.run(held, rt)
    # Acked inside the job's own transaction, with its writes, before the pipeline returned.
    assert type(outcome) is Succeeded and outcome.ack_json is None
    assert statuses([job]) == ["succeeded"]


def test_a_dropped_connection_costs_the_batch_nothing(caplog):
    caplog.set_level(logging.WARNING, logger="django_jobguard.worker")
    jobs = [tasks.add.enqueue(n) for n in range(3)]
    rt = batching_runtime()
    settled = [(held, pipeline.run(held, rt)) for held in claim(3)]
    # The database drops this thread's connection under Django (a restart, an idle timeout).
    connections[ALIAS].ensure_connection()
    connections[ALIAS].connection.close()

    rt.completer.settle_many(settled)

    assert statuses(jobs) == ["succeeded"] * 3
    assert [r for r in caplog.records if r.getMessage().startswith("ack_batch_failed")]


def test_acks_handed_over_are_written_when_the_worker_closes_them():
    jobs = [tasks.add.enqueue(n) for n in range(4)]
    rt = batching_runtime()
    for held in claim(4):
        rt.completer.settle(held, pipeline.run(held, rt))  # handed over: no ack thread runs here
    assert statuses(jobs) == ["running"] * 4
    rt.completer.close_acks(None, timeout=5)
    assert statuses(jobs) == ["succeeded"] * 4


def test_a_flush_writes_the_gathered_acks_without_waiting_out_the_window():
    jobs = [tasks.add.enqueue(n) for n in range(3)]
    # A window far longer than the deadline below: only the flush can write these in time.
    completer = Completer(ALIAS, WORKER_ID, ack_window=600.0, ack_batch_size=100)
    rt = pipeline.Runtime(ALIAS, WORKER_ID, completer)
    thread = threading.Thread(target=completer.run_acks, daemon=True)
    thread.start()
    try:
        for held in claim(3):
            completer.settle(held, pipeline.run(held, rt))
        assert completer.awaiting_acks == 3
        completer.flush()
        completer.flush()  # asked twice before the thread saw it: one flush is queued
        wait_for(
            lambda: statuses(jobs) == ["succeeded"] * 3,
            timeout=30,
            interval=0.01,
            message="the flushed acks to be written (the window alone would hold them 600 s)",
        )
        assert completer.awaiting_acks == 0
    finally:
        completer.close_acks(thread, timeout=30)
    assert not thread.is_alive()


def test_an_ack_of_members_nobody_waits_for_looks_up_no_dependants():
    from django_jobguard import Batch
    from django_jobguard.workflows import progress

    batch = Batch().enqueue([tasks.add.s(n, b=1) for n in range(3)])
    rt = batching_runtime()
    settled = [(held, pipeline.run(held, rt)) for held in claim(3)]
    with CaptureQueriesContext(connections[ALIAS]) as queries:
        rt.completer.settle_many(settled)
    assert not [q["sql"] for q in queries.captured_queries if "jobguard_jobdependency" in q["sql"]]
    assert statuses(Job.objects.order_by("pk")) == ["succeeded"] * 3
    p = progress(batch.id)  # the members still count
    assert (p.state, p.succeeded, p.pending) == ("finished", 3, 0)


def test_a_dependant_added_while_its_parent_runs_is_released_by_the_parents_batched_ack():
    from django_jobguard import Batch
    from django_jobguard.workflows import progress

    batch = Batch().enqueue([tasks.add.s(1, b=1)])
    (held,) = claim(1)
    assert not Job.objects.get(pk=held.job.id).has_dependants  # as the claim found it
    # While it runs, another job starts waiting for it (a member may be depended on mid-run).
    child = tasks.add.using(after=[held.job.id]).enqueue(2, b=2)
    assert statuses([child]) == ["waiting"]
    rt = batching_runtime()
    outcome = pipeline.run(held, rt)
    assert type(outcome) is Succeeded and outcome.ack_json is not None
    rt.completer.settle_many([(held, outcome)])
    assert statuses([child]) == ["queued"]
    assert progress(batch.id).succeeded == 1


def test_the_ack_reads_which_jobs_have_dependants_from_the_rows_it_writes():
    from django_jobguard import chain

    first, last = chain(tasks.add.s(1, b=1), tasks.add.s(2, b=2)).enqueue().jobs
    plain = tasks.add.enqueue(3, b=3)
    assert [Job.objects.get(pk=j.pk).has_dependants for j in (first, last, plain)] == [True, False, False]
    jobs = store.claim(ALIAS, None, 2, WORKER_ID)
    with transaction.atomic(using=ALIAS):
        acked = store.complete_many(ALIAS, [(job.id, job.lease_token, "null") for job in jobs])
    assert acked == {first.pk: True, plain.pk: False}


def test_a_job_written_without_the_column_is_looked_up_as_having_dependants():
    # As the ORM writes a job, or a process of an older release in a rolling upgrade (which
    # also stores dependencies without marking their parents): the column's default applies.
    written = Job.objects.create(task_name=tasks.add.name, args=[1], kwargs={"b": 1})
    stored = tasks.add.enqueue(2, b=2)  # the store's insert: nothing waits for it yet
    flags = dict(Job.objects.filter(pk__in=[written.pk, stored.pk]).values_list("pk", "has_dependants"))
    assert flags == {written.pk: True, stored.pk: False}
    jobs = store.claim(ALIAS, None, 2, WORKER_ID)
    with transaction.atomic(using=ALIAS):
        acked = store.complete_many(ALIAS, [(job.id, job.lease_token, "null") for job in jobs])
    assert acked == {written.pk: True, stored.pk: False}
