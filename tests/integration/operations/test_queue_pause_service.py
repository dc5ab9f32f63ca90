"""Queue pause and resume: the service rule, the claim that skips paused queues, the surfaces."""

import io

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_jobguard import store
from django_jobguard.exceptions import QueueError, QueuePermissionDenied
from django_jobguard.management.commands.jobguard_status import render_table
from django_jobguard.models import Job, QueueEvent, QueueState
from django_jobguard.monitoring import stats
from django_jobguard.operations import queues
from tests.support.factories import make_user
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _payments_is_a_queue():
    # Only queues that exist can be paused: these tests pause "payments" and "paused".
    queues_ = {**settings.JOBGUARD["QUEUES"], "payments": {}, "paused": {}}
    with override_settings(JOBGUARD={**settings.JOBGUARD, "QUEUES": queues_}):
        yield


def test_pause_records_who_when_why_and_resume_appends_to_the_trail():
    user = make_user("ops", "pause_queue")
    change = queues.pause("payments", user=user, reason="provider degraded")
    assert (change.queue, change.paused, change.changed, change.changed_by) == ("payments", True, True, "ops")
    state = QueueState.objects.get(pk="payments")
    assert (state.paused, state.changed_by, state.reason) == (True, user, "provider degraded")
    assert state.changed_at is not None
    assert queues.paused_queues() == {"payments"}
    queues.resume("payments", user=user, reason="provider back")
    assert queues.paused_queues() == set()
    trail = list(QueueEvent.objects.order_by("id").values_list("action", "actor_name", "reason"))
    assert trail == [("paused", "ops", "provider degraded"), ("resumed", "ops", "provider back")]


def test_pausing_twice_writes_nothing_the_second_time():
    queues.pause("payments", actor="shell:ops", reason="first")
    again = queues.pause("payments", actor="shell:other", reason="second")
    assert (again.changed, again.changed_by, again.reason) == (False, "shell:ops", "first")
    assert QueueEvent.objects.count() == 1


def test_resuming_a_queue_never_paused_leaves_no_row():
    result = queues.resume("payments", actor="shell:ops")
    assert (result.changed, result.paused) == (False, False)
    assert not QueueState.objects.exists() and not QueueEvent.objects.exists()


def test_a_pause_needs_a_reason_and_a_valid_name_and_writes_nothing_otherwise():
    with pytest.raises(QueueError, match="A reason is required to pause a queue"):
        queues.pause("payments", actor="x", reason="  ")
    with pytest.raises(QueueError, match="may not contain spaces"):
        queues.pause("pay ments", actor="x", reason="why")
    with pytest.raises(QueueError, match="A queue name is required"):
        queues.pause("", actor="x", reason="why")
    with pytest.raises(QueueError, match="longer than 100 characters"):
        queues.pause("q" * 101, actor="x", reason="why")
    assert not QueueState.objects.exists() and not QueueEvent.objects.exists()


def test_a_user_without_the_permission_may_not_pause_or_resume():
    user = make_user("ops")
    with pytest.raises(QueuePermissionDenied, match=r"needs the 'jobguard\.pause_queue' permission"):
        queues.pause("payments", user=user, reason="why")
    queues.pause("payments", actor="shell:ops", reason="why")
    with pytest.raises(QueuePermissionDenied, match="You may not resume queues"):
        queues.resume("payments", user=user)
    assert queues.paused_queues() == {"payments"}


def test_a_paused_queue_keeps_accepting_jobs_and_the_claim_skips_it():
    queues.pause("paused", actor="x", reason="why")
    held = tasks.add.using(queue_name="paused").enqueue(1)
    free = tasks.add.using(queue_name="free").enqueue(2)
    other = tasks.add.using(queue_name="other").enqueue(3)
    assert Job.objects.get(pk=held.pk).status == "queued"
    # Every shape of claim leaves it alone: one queue, several, all of them.
    assert store.claim("default", ["paused"], 10, "w") == []
    assert [job.id for job in store.claim("default", ["paused", "free"], 10, "w")] == [free.pk]
    with CaptureQueriesContext(connection) as queries:
        claimed = store.claim("default", None, 10, "w")
    assert [job.id for job in claimed] == [other.pk]
    # PostgreSQL reads the pauses in the claim statement itself; SQLite just before it;
    # MariaDB/MySQL too, before its claim transaction (pick, lease, read back).
    assert len(queries) == {"postgresql": 1, "sqlite": 2, "mysql": 4}[connection.vendor]
    assert Job.objects.get(pk=held.pk).status == "queued"
    # Resumed, it is claimed at the next poll.
    queues.resume("paused", actor="x")
    assert [job.id for job in store.claim("default", ["paused"], 10, "w")] == [held.pk]


def test_queue_stats_show_the_paused_queue_in_one_more_query():
    queues.pause("payments", actor="x", reason="why")
    with CaptureQueriesContext(connection) as ctx:
        rows = stats.queue_stats(recent=True)
    assert len(ctx.captured_queries) == stats.QUERIES_WITH_RECENT
    by_name = {row.queue: row for row in rows}
    assert by_name["payments"].paused is True
    assert by_name["default"].paused is False
    table = render_table(rows)
    assert "PAUSED" in table.splitlines()[0]
    assert any(line.startswith("payments") and "paused" in line for line in table.splitlines())


def command(*args):
    out = io.StringIO()
    call_command("jobguard_queue", *args, stdout=out)
    return out.getvalue()


def test_the_command_pauses_lists_and_resumes_with_an_audit_trail():
    assert "Queue 'payments' paused." in command("pause", "payments", "--reason", "provider down")
    assert "already paused" in command("pause", "payments", "--reason", "again")
    listing = command("list")
    assert "payments  paused" in listing and "reason: provider down" in listing and "by shell" in listing
    assert "Queue 'payments' resumed." in command("resume", "payments")
    assert "payments  running" in command("list")
    assert QueueEvent.objects.filter(actor_name__startswith="shell").count() == 2


def test_the_command_refuses_a_pause_without_a_reason_or_with_a_bad_name():
    with pytest.raises(CommandError, match="A reason is required"):
        command("pause", "payments", "--reason", "")
    with pytest.raises(CommandError, match="may not contain spaces"):
        command("pause", "pay ments", "--reason", "x")
    with pytest.raises(CommandError, match="no such database alias"):
        command("list", "--database", "nope")
    assert not QueueState.objects.exists()


def test_the_command_says_what_is_missing():
    with pytest.raises(CommandError, match="pause needs the name of a queue"):
        command("pause", "--reason", "x")
    with pytest.raises(CommandError, match="list takes no queue name"):
        command("list", "payments")


def test_the_paused_gauge_is_one_for_a_paused_queue_and_zero_otherwise(client):
    from prometheus_client.parser import text_string_to_metric_families

    queues.pause("payments", actor="x", reason="why")
    body = client.get("/metrics").content.decode()
    samples = {
        sample.labels["queue"]: sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == "jobguard_queue_paused"
    }
    assert samples["payments"] == 1.0 and samples["default"] == 0.0


def test_a_queue_that_does_not_exist_cannot_be_paused_and_nothing_is_written():
    with pytest.raises(CommandError, match=r"Queue 'paymnets' does not exist.*Known queues: .*payments"):
        command("pause", "paymnets", "--reason", "typo")
    with pytest.raises(QueueError, match="does not exist"):
        queues.pause("<b>x</b>", actor="x", reason="why")
    assert not QueueState.objects.exists() and not QueueEvent.objects.exists()


def test_an_undeclared_queue_with_jobs_can_be_paused_when_free_form_names_are_allowed():
    tasks.add.using(queue_name="adhoc").enqueue(1)
    assert queues.pause("adhoc", actor="x", reason="why").changed


def test_a_reason_longer_than_the_cap_is_refused():
    with pytest.raises(QueueError, match="at most 500 characters"):
        queues.pause("payments", actor="x", reason="r" * 501)
