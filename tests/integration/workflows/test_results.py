"""Results handed on: a group's or batch's callback takes its members' results, and a chain
step the previous result as its first positional argument. Run by a worker in this process."""

import pytest
from django.db.models.functions import Now

from django_jobguard import Batch, InvalidArgumentsError, chain, group
from django_jobguard.models import DeadLetter, Job
from django_jobguard.operations import jobs
from tests.support.dlq import run_burst
from tests.testapp import tasks, tasks_results
from tests.testapp.models import LedgerEntry

pytestmark = [
    pytest.mark.django_db(transaction=True),
]


def drain(rounds: int = 20) -> None:
    """Run burst workers until nothing is queued (an ack may queue a callback after a burst ends)."""
    for _ in range(rounds):
        Job.objects.filter(status="queued").update(run_after=Now())
        run_burst()
        if not Job.objects.filter(status__in=["queued", "running"]).exists():
            return
    pytest.fail("jobs still queued after draining")


def callback_of(workflow_id: int, task) -> Job:
    """The one callback job of ``task`` (callbacks are not members: no workflow id)."""
    members = Job.objects.filter(workflow_id=workflow_id).values_list("pk", flat=True)
    return Job.objects.exclude(pk__in=list(members)).get(task_name=task.name)


def members_of(workflow_id: int) -> list[Job]:
    return list(Job.objects.filter(workflow_id=workflow_id).order_by("pk"))


# -- callbacks receive their members' results ----------------------------------------------


def test_a_group_callback_receives_its_members_results_in_member_order():
    batch = group(
        [tasks_results.square.s(n) for n in (3, 1, 2)],
        then=tasks_results.collect.s("sum").receives_results("results"),
    ).enqueue()
    drain()
    callback = callback_of(batch.id, tasks_results.collect)
    # Member order, not the order of the values or of their completion.
    assert callback.kwargs["results"] == [9, 1, 4]
    assert (callback.status, callback.result["results"]) == ("succeeded", [9, 1, 4])


def test_a_callback_takes_the_results_positionally_without_a_name():
    batch = group(
        [tasks_results.square.s(n) for n in (2, 5)],
        then=tasks_results.collect_first.s(label="first").receives_results(),
    ).enqueue()
    drain()
    callback = callback_of(batch.id, tasks_results.collect_first)
    assert callback.args == [[4, 25]]
    assert callback.result == {"label": "first", "results": [4, 25]}


def test_without_receives_results_a_callback_is_given_no_results():
    batch = group(
        [tasks_results.square.s(n) for n in (1, 2)],
        then=tasks_results.collect.s("plain").receives("progress"),
    ).enqueue()
    drain()
    callback = callback_of(batch.id, tasks_results.collect)
    assert "results" not in callback.kwargs
    assert callback.result["results"] is None
    assert (callback.result["progress"]["succeeded"], callback.result["progress"]["failed"]) == (2, 0)


def test_a_callback_can_take_the_summary_and_the_results_together():
    batch = Batch(
        on_complete=tasks_results.collect.s("both").receives("progress").receives_results("results")
    ).enqueue([tasks_results.square.s(n) for n in (4, 3)])
    drain()
    result = callback_of(batch.id, tasks_results.collect).result
    assert result["results"] == [16, 9]
    assert (result["progress"]["total"], result["progress"]["succeeded"]) == (2, 2)


def test_failed_members_are_marked_in_their_place_with_their_status_and_error():
    batch = Batch(on_complete=tasks_results.collect.s("mixed").receives_results("results")).enqueue(
        [tasks_results.square.s(2), tasks_results.fails.s(7), tasks_results.square.s(3), tasks.wf_step.s("x")]
    )
    _, dead, _, cancelled = members_of(batch.id)
    assert jobs.cancel([cancelled.pk], reason="not needed") == [cancelled.pk]
    drain()
    results = callback_of(batch.id, tasks_results.collect).result["results"]
    assert results[0] == 4 and results[2] == 9
    assert results[1]["jobguard_failed"] is True
    assert (results[1]["job_id"], results[1]["status"]) == (dead.pk, "dead")
    assert "member 7: planned failure" in results[1]["error"]
    assert (results[3]["job_id"], results[3]["status"]) == (cancelled.pk, "cancelled")
    assert "not needed" in results[3]["error"]


def test_a_batch_built_over_several_adds_hands_on_results_in_the_order_members_joined():
    batch = Batch(on_success=tasks_results.collect.s("built").receives_results("results")).open()
    batch.add([tasks_results.square.s(5)])
    batch.add([tasks_results.square.s(1), tasks_results.square.s(6)])
    drain()  # the members run before the batch is closed: no callback yet
    assert not Job.objects.filter(task_name=tasks_results.collect.name).exists()
    batch.close()
    drain()
    assert callback_of(batch.id, tasks_results.collect).result["results"] == [25, 1, 36]


def test_a_replayed_member_gives_its_result_in_the_dead_members_place():
    from django_jobguard import dlq
    from tests.support.factories import make_user

    batch = Batch(on_success=tasks_results.collect.s("replayed").receives_results("results")).enqueue(
        [tasks_results.square.s(2), tasks.wf_fails_until_allowed.s("m"), tasks_results.square.s(3)]
    )
    drain()
    assert not Job.objects.filter(task_name=tasks_results.collect.name).exists()  # not a success
    _, dead, _ = members_of(batch.id)
    LedgerEntry.objects.create(effect_key="allow:m")  # the fix is deployed
    letter = DeadLetter.objects.get(job_id=dead.pk)
    dlq.request_replay(letter, make_user("rita", "request_replay", "view_deadletter"), "fixed")
    dlq.approve_replay(letter, make_user("amir", "approve_replay", "view_deadletter"), "checked")
    drain()
    letter.refresh_from_db()
    assert Job.objects.get(pk=letter.replay_job_id).status == "succeeded"
    # The replay's result sits where the dead member was, not at the end.
    assert callback_of(batch.id, tasks_results.collect).result["results"] == [4, "m-done", 9]


def test_receives_results_is_refused_where_there_are_no_members_and_nothing_is_written():
    before = Job.objects.count()
    step = tasks_results.collect.s("x").receives_results("results")
    with pytest.raises(InvalidArgumentsError, match=r"a chain step has no members' results to receive"):
        chain(tasks_results.square.s(1), step)
    with pytest.raises(InvalidArgumentsError, match=r"a batch member has no previous result to receive"):
        Batch().enqueue([tasks_results.square.s(1), step])
    assert Job.objects.count() == before


# -- a chain passes a result positionally --------------------------------------------------


def test_a_chain_step_receives_the_previous_result_as_its_first_positional_argument():
    wf = chain(tasks.add.s(1, 2), tasks.add.s(10).receives(), tasks.add.s(b=100).receives()).enqueue()
    drain()
    first, second, third = (Job.objects.get(pk=job.pk) for job in wf.jobs)
    assert (first.result, second.args, second.result) == (3, [3, 10], 13)
    assert (third.args, third.kwargs, third.result) == ([13], {"b": 100}, 113)


def test_a_replayed_step_passes_its_result_positionally_once():
    """The placeholder is replaced, not prepended again, when a replay releases the step."""
    from django_jobguard import dlq
    from tests.support.factories import make_user

    wf = chain(
        tasks.wf_fails_until_allowed.s("p"), tasks_results.collect_first.s(label="after").receives()
    ).enqueue()
    drain()
    dead, after = wf.jobs
    LedgerEntry.objects.create(effect_key="allow:p")
    letter = DeadLetter.objects.get(job_id=dead.pk)
    dlq.request_replay(letter, make_user("rita", "request_replay", "view_deadletter"), "fixed")
    dlq.approve_replay(letter, make_user("amir", "approve_replay", "view_deadletter"), "checked")
    drain()
    after.refresh_from_db()
    assert (after.status, after.args, after.result) == (
        "succeeded",
        ["p-done"],
        {"label": "after", "results": "p-done"},
    )
