"""A batch under a SIGKILL storm: no member lost, one callback, counters that match the rows."""

import os
import time

import pytest
from django.db.models import Count

from django_jobguard import Batch
from django_jobguard.models import Job, Workflow, WorkflowCallback
from django_jobguard.workflows import progress
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution, LedgerEntry

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
]

#: Members of the batch; a few thousand take minutes on a loaded 2-core machine.
MEMBERS = int(os.environ.get("JOBGUARD_TEST_WORKFLOW_MEMBERS", "5000"))
#: Seconds between two kills.
KILL_EVERY_SECONDS = 1.0


def test_a_batch_survives_workers_killed_in_a_loop(workers):
    # Half the members ack inside their own transaction (atomic), half through batched acks.
    members = [
        (tasks.short_lease if i % 2 else tasks.short_lease_plain).s(f"member-{i}", seconds=0.01)
        for i in range(MEMBERS)
    ]
    batch = Batch(
        on_success=tasks.record.s("on-success"),
        on_complete=tasks.record.s("on-complete"),
        on_dead=tasks.record.s("on-dead"),
    ).enqueue(members)

    alive = [workers.start("--concurrency", "4") for _ in range(2)]
    for proc in alive:
        workers.wait_started(proc, timeout=120)
    kills = 0
    deadline = time.monotonic() + 900
    while progress(batch.id).pending and time.monotonic() < deadline:
        # The storm's cadence, not a wait: the loop ends on the batch's progress, under `deadline`.
        time.sleep(KILL_EVERY_SECONDS)
        victim = alive.pop(0)
        victim.kill()  # SIGKILL: whatever it held was mid-flight, acks included
        victim.wait(timeout=10)
        kills += 1
        fresh = workers.start("--concurrency", "4")
        # Each worker gets to work before the next kill, however slowly the machine starts one.
        workers.wait_started(fresh, timeout=120)
        alive.append(fresh)
    wait_for(
        lambda: Workflow.objects.get(pk=batch.id).state == "finished",
        timeout=300,
        message="every member to settle after the last kill",
    )
    callbacks = Job.objects.filter(task_name=tasks.record.name)
    wait_for(
        lambda: (
            callbacks.exists() and all(s == "succeeded" for s in callbacks.values_list("status", flat=True))
        ),
        timeout=120,
        message="the callbacks to run",
    )
    assert kills >= 3, "the batch finished before the storm began; raise JOBGUARD_TEST_WORKFLOW_MEMBERS"

    rows = dict(
        Job.objects.filter(workflow_id=batch.id).values_list("status").annotate(n=Count("id")).order_by()
    )
    p = progress(batch.id)
    # 0 members lost: every one settled, and the counters say what the rows say.
    assert sum(rows.values()) == MEMBERS
    assert set(rows) <= {"succeeded", "dead"}
    assert (p.total, p.succeeded, p.failed, p.pending) == (
        MEMBERS,
        rows.get("succeeded", 0),
        rows.get("dead", 0),
        0,
    )
    # An atomic member's effect committed with its ack, and only then.
    atomic_done = Job.objects.filter(
        workflow_id=batch.id, task_name=tasks.short_lease.name, status="succeeded"
    )
    assert LedgerEntry.objects.filter(effect_key__startswith="member-").count() == atomic_done.count()
    # Exactly one callback per outcome that applies, each run once.
    expected = {"on-complete", "on-success" if not rows.get("dead") else "on-dead"}
    assert sorted(callbacks.values_list("args", flat=True)) == sorted([[marker] for marker in expected])
    assert WorkflowCallback.objects.filter(workflow_id=batch.id).count() == 2
    assert (
        set(LedgerEntry.objects.filter(effect_key__startswith="on-").values_list("effect_key", flat=True))
        == expected
    )
    # Members whose worker was killed mid-run ran again; each was still counted once (above).
    runs = Execution.objects.filter(marker__startswith="member-").count()
    print(f"members={MEMBERS} kills={kills} runs={runs} succeeded={p.succeeded} failed={p.failed}")
