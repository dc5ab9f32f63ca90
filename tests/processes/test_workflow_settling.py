"""Every member of a batch emptying its own counter shard, in several workers at once.

Each member's completion then checks the batch under its row lock. On MariaDB/MySQL an
upsert of a counter row took a shared lock on the workflow row first (its foreign key), so
two such completions deadlocked: an atomic member's ack rolled back with its effect and cost
it an attempt, a batched ack ran again. Row locks are what this is about: PostgreSQL and
MariaDB/MySQL only.
"""

import pytest

from django_jobguard import Batch
from django_jobguard.models import WORKFLOW_COUNTER_SHARDS, Job, Workflow, WorkflowCallback
from django_jobguard.workflows import progress
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution, LedgerEntry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.server_db]

#: One member per shard: consecutive ids fill every shard once.
MEMBERS = WORKFLOW_COUNTER_SHARDS


def test_members_each_emptying_a_shard_settle_in_one_attempt_and_finish_the_batch_once(workers):
    # Half atomic (the ack in the job's own transaction), half through batched acks.
    members = [(tasks.record if i % 2 else tasks.record_plain).s(f"shard-{i}") for i in range(MEMBERS)]
    batch = Batch(on_success=tasks.record.s("on-success"), on_complete=tasks.record.s("on-complete")).enqueue(
        members
    )
    ids = list(Job.objects.filter(workflow_id=batch.id).values_list("pk", flat=True))
    assert len({pk % WORKFLOW_COUNTER_SHARDS for pk in ids}) == MEMBERS

    procs = [workers.start("--concurrency", "4") for _ in range(3)]
    wait_for(
        lambda: Workflow.objects.get(pk=batch.id).state == "finished",
        timeout=300,
        message="every member to settle",
    )
    # Not one member ran twice: no ack was rolled back.
    again = list(Job.objects.filter(workflow_id=batch.id, attempts__gt=1).values_list("pk", "attempts"))
    assert again == []
    assert Execution.objects.filter(marker__startswith="shard-").count() == MEMBERS
    p = progress(batch.id)
    assert (p.total, p.succeeded, p.failed, p.pending) == (MEMBERS, MEMBERS, 0, 0)
    callbacks = Job.objects.filter(pk__in=WorkflowCallback.objects.values("job_id"))
    wait_for(
        lambda: callbacks.count() == 2 and set(callbacks.values_list("status", flat=True)) == {"succeeded"},
        timeout=120,
        message="the callbacks to run",
    )
    assert sorted(callbacks.values_list("args", flat=True)) == [["on-complete"], ["on-success"]]
    assert LedgerEntry.objects.filter(effect_key__startswith="on-").count() == 2
    logs = "".join(workers.log(proc) for proc in procs)
    assert "Deadlock found" not in logs
    assert "operation=add_workflow_counts" not in logs and "operation=ack_batch" not in logs
