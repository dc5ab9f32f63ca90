"""Workflows: chains, groups, batches and dependencies, run by a worker in this process."""

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from django_jobguard import Batch, InvalidArgumentsError, chain, group, store, task
from django_jobguard.models import Job, JobDependency, Workflow, WorkflowCallback, WorkflowCounter
from django_jobguard.operations import jobs
from django_jobguard.workflows import progress
from tests.support.dlq import run_burst
from tests.testapp import tasks
from tests.testapp.models import Execution, LedgerEntry

pytestmark = [
    pytest.mark.django_db(transaction=True),
]


def drain(rounds: int = 20) -> None:
    """Run burst workers until nothing is queued: a burst ends when nothing is due, and the
    ack of one step may queue the next just after that."""
    for _ in range(rounds):
        # Retry backoffs are made due at once, so a test waits on no clock.
        Job.objects.filter(status="queued").update(run_after=Now())
        run_burst()
        if not Job.objects.filter(status__in=["queued", "running"]).exists():
            return
    pytest.fail("jobs still queued after draining")


def ran(marker: str) -> int:
    return Execution.objects.filter(marker=marker).count()


def status(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


# -- waiting jobs --------------------------------------------------------------------------


def test_waiting_steps_are_never_claimed_until_their_dependency_succeeds():
    wf = chain(tasks.wf_step.s("a"), tasks.wf_step.s("b")).enqueue()
    first, second = wf.jobs
    assert (status(first), status(second)) == ("queued", "waiting")
    claimed = store.claim("default", None, 10, "w")
    assert [job.id for job in claimed] == [first.pk]
    assert claimed[0].workflow_id == wf.pk
    assert store.claim("default", None, 10, "w") == []  # the waiting step is not claimable


def test_the_claim_indexes_hold_no_waiting_job():
    # The due indexes are partial on queued rows: a waiting job has no entry to scan.
    from django.db.models import Q

    from django_jobguard.models import Job as JobModel

    conditions = [index.condition for index in JobModel._meta.indexes if "due" in index.name]
    assert len(conditions) == 2
    assert all(condition == Q(status="queued") for condition in conditions)


def test_a_rolled_back_workflow_leaves_no_row():
    before = (Job.objects.count(), Workflow.objects.count(), JobDependency.objects.count())
    with pytest.raises(RuntimeError), transaction.atomic():
        chain(tasks.wf_step.s("a"), tasks.wf_step.s("b")).enqueue()
        Batch(on_complete=tasks.wf_callback.s("cb")).enqueue([tasks.wf_step.s("m1"), tasks.wf_step.s("m2")])
        tasks.wf_step.using(after=[Job.objects.order_by("-pk").first()]).enqueue("c")
        raise RuntimeError("roll back")
    assert (Job.objects.count(), Workflow.objects.count(), JobDependency.objects.count()) == before
    assert WorkflowCounter.objects.count() == 0


# -- chains --------------------------------------------------------------------------------


def test_a_chain_runs_its_steps_in_order_and_passes_a_result_on_request():
    wf = chain(
        tasks.wf_step.s("charge"),
        tasks.wf_step.s("reserve").receives("previous"),
        tasks.wf_step.s("receipt"),
    ).enqueue()
    drain()
    order = list(Execution.objects.order_by("pk").values_list("marker", flat=True))
    assert order == ["charge", "reserve", "receipt"]
    assert LedgerEntry.objects.filter(effect_key="reserve<-charge-done").exists()
    assert [status(job) for job in wf.jobs] == ["succeeded"] * 3
    assert progress(wf.pk).as_dict() == {
        "workflow_id": wf.pk,
        "state": "finished",
        "total": 3,
        "succeeded": 3,
        "failed": 0,
        "pending": 0,
    }


def test_a_dead_lettered_step_marks_the_rest_upstream_failed():
    wf = chain(
        tasks.wf_step.s("one"), tasks.wf_fails.s("two"), tasks.wf_step.s("three"), tasks.wf_step.s("four")
    )
    wf = wf.enqueue()
    drain()
    one, two, three, four = (Job.objects.get(pk=job.pk) for job in wf.jobs)
    assert (one.status, two.status) == ("succeeded", "dead")
    assert (three.status, four.status) == ("cancelled", "cancelled")
    assert three.last_error == f"upstream failed: job #{two.pk} was dead-lettered"
    assert four.last_error == f"upstream failed: job #{three.pk} was cancelled"
    assert ran("three") == ran("four") == 0
    p = progress(wf.pk)
    assert (p.state, p.succeeded, p.failed, p.pending) == ("finished", 1, 3, 0)


# -- dependencies --------------------------------------------------------------------------


def test_a_job_runs_after_every_job_it_depends_on():
    a = tasks.wf_step.enqueue("a")
    b = tasks.wf_step.enqueue("b")
    c = tasks.wf_step.using(after=[a, b.pk]).enqueue("c")
    assert (c.status, c.waiting_on) == ("waiting", 2)
    drain()
    order = list(Execution.objects.order_by("pk").values_list("marker", flat=True))
    assert order[-1] == "c" and sorted(order) == ["a", "b", "c"]
    assert status(c) == "succeeded"


def test_a_job_after_finished_jobs_is_queued_at_once():
    a = tasks.wf_step.enqueue("a")
    drain()
    c = tasks.wf_step.using(after=[a]).enqueue("c")
    assert status(c) == "queued"


def test_cancelling_a_parent_cancels_its_pending_dependents_with_the_reason():
    a = tasks.wf_step.enqueue("a")
    b = tasks.wf_step.using(after=[a]).enqueue("b")
    c = tasks.wf_step.using(after=[b]).enqueue("c")
    assert jobs.cancel([a.pk], reason="order withdrawn") == [a.pk]
    b.refresh_from_db()
    c.refresh_from_db()
    assert (b.status, b.last_error) == ("cancelled", f"upstream failed: job #{a.pk} was cancelled")
    assert (c.status, c.last_error) == ("cancelled", f"upstream failed: job #{b.pk} was cancelled")
    drain()
    assert ran("b") == ran("c") == 0


def test_a_dependency_cycle_is_refused_and_nothing_written():
    a = tasks.add.using(idempotency_key="cycle").enqueue(1)
    count = Job.objects.count()
    with pytest.raises(InvalidArgumentsError, match=r"dependency cycle"):
        tasks.add.using(idempotency_key="cycle", after=[a]).enqueue(1)
    assert Job.objects.count() == count
    assert JobDependency.objects.count() == 0


def test_after_a_job_that_does_not_exist_or_is_dead_is_refused():
    with pytest.raises(InvalidArgumentsError, match=r"after: no job #987654"):
        tasks.wf_step.using(after=[987654]).enqueue("x")
    dead = tasks.wf_fails.enqueue("d")
    drain()
    with pytest.raises(InvalidArgumentsError, match=r"is dead, so a job waiting for it would never run"):
        tasks.wf_step.using(after=[dead]).enqueue("x")
    assert not Job.objects.filter(task_name=tasks.wf_step.name).exists()


# -- groups and batches --------------------------------------------------------------------


def callbacks_counted(kind: str, when: str) -> float:
    from prometheus_client import REGISTRY

    labels = {"kind": kind, "when": when}
    return REGISTRY.get_sample_value("jobguard_workflow_callbacks_total", labels) or 0.0


def test_a_group_runs_its_callback_once_after_every_member_succeeded():
    counted = callbacks_counted("group", "success")
    batch = group([tasks.wf_step.s(f"m{i}") for i in range(5)], then=tasks.wf_callback.s("done")).enqueue()
    drain()
    assert ran("done") == 1
    assert callbacks_counted("group", "success") == counted + 1
    assert WorkflowCallback.objects.filter(workflow_id=batch.id).count() == 1
    p = batch.progress()
    assert (p.state, p.total, p.succeeded, p.failed, p.pending) == ("finished", 5, 5, 0, 0)


def test_batch_callbacks_choose_by_outcome_and_receive_the_progress():
    batch = Batch(
        on_success=tasks.wf_callback.s("ok"),
        on_complete=tasks.wf_callback.s("all").receives("progress"),
        on_dead=tasks.wf_callback.s("dead").receives("progress"),
    ).enqueue([tasks.wf_step.s("m1"), tasks.wf_fails.s("m2"), tasks.wf_step.s("m3")])
    drain()
    assert (ran("ok"), ran("all"), ran("dead")) == (0, 1, 1)
    assert LedgerEntry.objects.filter(effect_key__in=["all:2/1", "dead:2/1"]).count() == 2
    # The record outlives its callbacks.
    assert Workflow.objects.get(pk=batch.id).state == "finished"


def test_a_member_that_failed_then_succeeded_counts_as_a_success():
    batch = Batch(on_success=tasks.wf_callback.s("ok")).enqueue(
        [tasks.flaky.s("retried", failures=1), tasks.wf_step.s("m")]
    )
    drain()
    p = batch.progress()
    assert (p.succeeded, p.failed, p.pending) == (2, 0, 0)
    assert ran("retried") == 2
    assert ran("ok") == 1


def test_an_open_batch_runs_no_callback_before_it_is_closed():
    batch = Batch(on_complete=tasks.wf_callback.s("cb")).open()
    batch.add([tasks.wf_step.s("m1")])
    drain()
    assert batch.progress().pending == 0
    assert ran("cb") == 0  # every member so far settled, but more may come
    batch.add([tasks.wf_step.s("m2"), tasks.wf_step.s("m3")])
    drain()
    assert ran("cb") == 0
    batch.close()
    drain()
    assert ran("cb") == 1
    p = batch.progress()
    assert (p.total, p.succeeded) == (3, 3)
    with pytest.raises(InvalidArgumentsError, match=r"is finished: it accepts no more members"):
        batch.add([tasks.wf_step.s("late")])


# -- bad input -----------------------------------------------------------------------------


def test_bad_input_is_refused_at_enqueue_and_nothing_is_written():
    count = (Job.objects.count(), Workflow.objects.count())
    with pytest.raises(InvalidArgumentsError, match=r"chain\(\) needs at least one step"):
        chain()
    with pytest.raises(InvalidArgumentsError, match=r"Arguments do not fit"):
        tasks.add.s(1, c=3)
    with pytest.raises(InvalidArgumentsError, match=r"Arguments do not fit"):
        chain(tasks.wf_step.s("a"), tasks.add.s()).enqueue()  # a is missing: refused before any write

    @task(name="tests.unregistered_callback_for_workflows")
    def stray(x: int) -> None: ...

    from django_jobguard.registry import registry

    registry.unregister(stray.name)
    with pytest.raises(InvalidArgumentsError, match=r"is not a registered task"):
        Batch(on_complete=stray.s(1))
    with pytest.raises(InvalidArgumentsError, match=r"is not a registered task.s step; make one with task.s"):
        Batch(on_complete=tasks.wf_callback)
    assert (Job.objects.count(), Workflow.objects.count()) == count


def test_waiting_is_its_own_status_in_sql():
    wf = chain(tasks.wf_step.s("a"), tasks.wf_step.s("b")).enqueue()
    with connection.cursor() as cursor:
        cursor.execute("SELECT status, waiting_on FROM jobguard_job WHERE id = %s", [wf.jobs[1].pk])
        assert cursor.fetchone() == ("waiting", 1)


def test_replaying_a_dead_step_resumes_the_chain():
    from django_jobguard import dlq
    from django_jobguard.models import DeadLetter
    from tests.support.factories import make_user

    wf = chain(
        tasks.wf_step.s("one"),
        tasks.wf_fails_until_allowed.s("two"),
        tasks.wf_step.s("three").receives("previous"),
        tasks.wf_step.s("four"),
    ).enqueue()
    drain()
    _, two, three, four = wf.jobs
    assert [status(job) for job in wf.jobs] == ["succeeded", "dead", "cancelled", "cancelled"]
    assert progress(wf.pk).state == "finished"

    LedgerEntry.objects.create(effect_key="allow:two")  # the fix is deployed
    letter = DeadLetter.objects.get(job_id=two.pk)
    dlq.request_replay(letter, make_user("rita", "request_replay", "view_deadletter"), "fixed")
    dlq.approve_replay(letter, make_user("amir", "approve_replay", "view_deadletter"), "checked")
    drain()
    letter.refresh_from_db()
    replay = Job.objects.get(pk=letter.replay_job_id)
    assert replay.status == "succeeded" and replay.workflow_id == wf.pk
    assert [status(job) for job in (three, four)] == ["succeeded", "succeeded"]
    assert LedgerEntry.objects.filter(effect_key="three<-two-done").exists()
    p = progress(wf.pk)
    # The dead step is replaced by its replay: four members, all succeeded.
    assert (p.state, p.total, p.succeeded, p.failed, p.pending) == ("finished", 4, 4, 0, 0)


def test_a_member_that_runs_twice_is_counted_once():
    import datetime

    from django.utils import timezone

    from django_jobguard.exceptions import LeaseLost
    from django_jobguard.maintenance.reaper import Reaper
    from django_jobguard.worker.completer import Completer
    from django_jobguard.worker.held import Held

    batch = Batch(on_complete=tasks.wf_callback.s("cb")).enqueue([tasks.wf_step.s("twice")])
    (stale,) = store.claim("default", None, 1, "frozen")
    # The frozen worker's lease runs out; the reaper gives the job back and another worker runs it.
    Job.objects.filter(pk=stale.id).update(lease_expires_at=timezone.now() - datetime.timedelta(hours=1))
    assert Reaper("default").run_once().reappeared == 1
    drain()
    assert status(Job(pk=stale.id)) == "succeeded"
    # The frozen worker wakes and acks: refused by the lease token, so nothing is counted again.
    completer = Completer("default", "frozen")
    with pytest.raises(LeaseLost), transaction.atomic():
        completer.write_ack(Held(stale, 0.0), "", "late", '"late"')
    p = batch.progress()
    assert (p.total, p.succeeded, p.failed, p.pending) == (1, 1, 0, 0)
    assert ran("cb") == 1
    assert WorkflowCallback.objects.filter(workflow_id=batch.id).count() == 1


def test_the_batch_record_outlives_its_callbacks_and_the_pruning_of_its_jobs():
    import datetime

    from django_jobguard.maintenance import retention

    batch = Batch(on_complete=tasks.wf_callback.s("cb")).enqueue(
        [tasks.wf_step.s("m1"), tasks.wf_step.s("m2")]
    )
    drain()
    assert ran("cb") == 1
    assert retention.prune_finished_jobs(older_than=datetime.timedelta(seconds=-60)) >= 3
    assert not Job.objects.filter(workflow_id=batch.id).exists()
    p = progress(batch.id)
    assert (p.state, p.total, p.succeeded, p.failed, p.pending) == ("finished", 2, 2, 0, 0)
    assert WorkflowCallback.objects.filter(workflow_id=batch.id, when="complete").count() == 1


def test_a_member_cancelled_and_retried_then_succeeding_counts_once_as_a_success():
    from django_jobguard.operations import workflows as workflow_ops
    from tests.support.factories import make_user

    batch = Batch(on_success=tasks.wf_callback.s("ok")).enqueue(
        [tasks.wf_step.s("m1"), tasks.wf_step.s("m2")]
    )
    member = Job.objects.filter(workflow_id=batch.id).order_by("pk").first()
    jobs.cancel([member.pk], reason="by mistake")
    drain()
    assert ran("ok") == 0
    assert (batch.progress().succeeded, batch.progress().failed) == (1, 1)
    result = workflow_ops.retry_failed(batch.id, make_user("ops", "retry_job"), "cancelled by mistake")
    assert result.requeued == [member.pk]
    drain()
    p = batch.progress()
    assert (p.state, p.total, p.succeeded, p.failed, p.pending) == ("finished", 2, 2, 0, 0)
    assert ran("ok") == 1


def test_workflow_actions_refuse_bad_input_and_change_nothing():
    from django_jobguard.operations import workflows as workflow_ops
    from tests.support.factories import make_user

    with pytest.raises(InvalidArgumentsError, match=r"No workflow #987654"):
        workflow_ops.cancel(987654)
    batch = Batch().enqueue([tasks.wf_step.s("m1")])
    with pytest.raises(InvalidArgumentsError, match=r"reason"):
        workflow_ops.retry_failed(batch.id, make_user("ops", "retry_job"), "  ")
    assert batch.progress().pending == 1


def test_settling_many_members_writes_their_counters_in_one_statement_in_shard_order():
    import re

    from django.test.utils import CaptureQueriesContext

    from django_jobguard.workflows import jobs_settled

    batch = Batch().enqueue([tasks.wf_step.s(f"m{i}") for i in range(6)])
    members = list(Job.objects.filter(workflow_id=batch.id).values_list("pk", flat=True))
    Job.objects.filter(pk__in=members).update(status="succeeded")
    with transaction.atomic(), CaptureQueriesContext(connection) as ctx:
        # Given in reverse: the statement orders the rows, so two acks never lock them in a circle.
        jobs_settled(connection.alias, [(pk, batch.id, "succeeded", "null") for pk in reversed(members)])
    counters = [q["sql"] for q in ctx.captured_queries if "jobguard_workflowcounter" in q["sql"]]
    if connection.vendor == "mysql":
        # No RETURNING on an upsert: one locking read in index order, then one UPDATE by id.
        (lock,) = [sql for sql in counters if sql.endswith("FOR UPDATE")]
        assert len([sql for sql in counters if sql.startswith("UPDATE")]) == 1
        assert "ORDER BY workflow_id, shard FOR UPDATE" in lock
        assert not [sql for sql in counters if sql.startswith("INSERT")]
        shards = [int(shard) for shard in re.findall(r"shard IN \(([^)]*)\)", lock)[0].split(", ")]
    else:
        (write,) = [sql for sql in counters if "INSERT" in sql]
        shards = [int(shard) for shard in re.findall(rf"\({batch.id}, (\d+),", write)]
    assert shards == sorted(shards) and len(shards) == len({pk % 256 for pk in members})
    p = batch.progress()
    assert (p.state, p.succeeded, p.pending) == ("finished", 6, 0)


def test_without_ack_batching_a_members_ack_and_its_bookkeeping_commit_together(monkeypatch):
    """ACK_WINDOW = 0: the pipeline acks a non-atomic member itself, in one transaction with
    its workflow bookkeeping; a failure between the two leaves neither written."""
    import time

    from django_jobguard import workflows
    from django_jobguard.outcome import HeldState, Retry
    from django_jobguard.worker import pipeline
    from django_jobguard.worker.completer import Completer
    from django_jobguard.worker.held import Held

    batch = Batch(on_complete=tasks.add.s(1)).enqueue([tasks.add.s(2)])
    (claimed,) = store.claim("default", None, 1, "ack-window-0")
    now = time.monotonic()
    held = Held(job=claimed, renewed_at=now, state=HeldState.RUNNING, started_at=now)
    completer = Completer("default", "ack-window-0")  # no ack window: the pipeline writes the ack
    assert not completer.batches_acks

    def cut_off(*args, **kwargs):
        raise RuntimeError("the process died between the ack and the workflow's bookkeeping")

    monkeypatch.setattr(workflows, "job_settled", cut_off)
    outcome = pipeline.run(held, pipeline.Runtime("default", "ack-window-0", completer))
    assert type(outcome) is Retry
    # The ack rolled back with the bookkeeping: the member is still held, its batch not settled.
    member = Job.objects.get(pk=claimed.id)
    assert member.status == "running" and member.lease_token == claimed.lease_token
    assert progress(batch.id).pending == 1
    completer.settle(held, outcome)
    assert Job.objects.get(pk=claimed.id).status == "queued"
    monkeypatch.undo()
    drain()
    assert Job.objects.get(pk=claimed.id).status == "succeeded"
    assert WorkflowCallback.objects.filter(workflow_id=batch.id).count() == 1


@pytest.mark.parametrize("how", ["batch", "open-add", "chain"])
def test_members_are_inserted_as_members_without_a_second_write_of_their_rows(how):
    from django.test.utils import CaptureQueriesContext

    steps = [tasks.wf_step.s(f"m{i}") for i in range(3)]
    with CaptureQueriesContext(connection) as ctx:
        if how == "batch":
            workflow_id = Batch().enqueue(steps).id
        elif how == "open-add":
            batch = Batch().open()
            batch.add(steps)
            workflow_id = batch.id
        else:
            workflow_id = chain(*steps).enqueue().pk
    member_updates = [
        q["sql"] for q in ctx.captured_queries if q["sql"].startswith("UPDATE") and "workflow_id" in q["sql"]
    ]
    assert member_updates == []  # a 100,000-member batch would otherwise write each row twice
    assert Job.objects.filter(workflow_id=workflow_id).count() == 3
    assert progress(workflow_id).pending == 3
