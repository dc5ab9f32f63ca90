"""The queue health page as a triage page: the causes per queue, their order, their links, bounded queries.

Real rows (jobs, breaker and lock rows, dead letters, worker beats) in the shape of the
round-3 console incident (tests/support/triage.py); no part of the service is mocked.
"""

import datetime
import re
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobguard import store
from django_jobguard.models import Breaker, Job
from django_jobguard.monitoring import health
from django_jobguard.operations import queues
from django_jobguard.registry import registry
from tests.support import triage
from tests.support.factories import force_login
from tests.testapp import tasks, tasks_flow

pytestmark = pytest.mark.django_db

URL = "/admin/jobguard/queuestate/"


@pytest.fixture(autouse=True)
def flow_tasks():
    for task in tasks_flow.ALL:
        registry.register(task)
    yield
    for task in tasks_flow.ALL:
        registry.unregister(task.name)


@pytest.fixture
def viewer(client):
    force_login(client, "viewer", "view_job", "view_deadletter", "view_breaker", "view_lock")
    return client


def kinds(report, queue):
    return [(cause.kind, cause.severity) for cause in report.causes[queue]]


def text_of(report, queue, kind):
    return next(cause.text for cause in report.causes[queue] if cause.kind == kind)


def test_the_incident_names_all_three_causes_and_ranks_those_queues_first():
    triage.incident()
    report = health.queue_health()
    assert kinds(report, "flow-dep") == [("breaker", health.CRITICAL)]
    breaker = text_of(report, "flow-dep", "breaker")
    assert re.fullmatch(r"breaker flow-dep open, next probe in 6[45] s \(4 due jobs wait\)", breaker), breaker
    assert kinds(report, "accounts") == [("lock", health.CRITICAL)]
    lock = text_of(report, "accounts", "lock")
    assert lock.startswith("lock account:999 contended 1,074 times (2.0/s) by 1 job with its holder gone"), (
        lock
    )
    assert "expires in 10 min" in lock
    assert kinds(report, "emails") == [("dead_lettered", health.CRITICAL)]
    assert (
        text_of(report, "emails", "dead_lettered")
        == "3 jobs dead-lettered in the last hour (3 unresolved in all)"
    )
    for name in triage.HEALTHY:
        assert report.causes[name] == [], name
    order = [stats.queue for stats in report.triaged()]
    # Most severe first, then the oldest due job: the breaker's jobs waited 16 minutes.
    assert order[:3] == ["flow-dep", "accounts", "emails"], order
    assert order[3:] == sorted(order[3:])


def test_a_lock_whose_holder_runs_is_no_emergency_and_a_free_lock_is_no_cause():
    triage.live_worker()
    job = triage.contended_lock()
    holder = tasks.add.using(queue_name="accounts").enqueue(2)
    Job.objects.filter(pk=holder.pk).update(
        status="running",
        lock_key=triage.LOCK_KEY,
        worker_id="web-1:4001:live",
        lease_token="1" * 32,
        lease_expires_at=timezone.now() + datetime.timedelta(minutes=1),
        started_at=timezone.now(),
    )
    triage.Lock.objects.update(token=triage.lock_owner(holder.pk, "1" * 32))
    [cause] = health.queue_health().causes["accounts"]
    assert (cause.kind, cause.severity) == ("lock", health.WARNING)
    assert f"held by job #{holder.pk} on web-1:4001:live" in cause.text
    # Below the warning's threshold a contended lock with a live holder is ordinary waiting.
    Job.objects.filter(pk=job.pk).update(lock_contentions=health.LOCK_CONTENTIONS_WARNING - 1)
    assert health.queue_health().causes["accounts"] == []
    # The holder ends; the lock row is free (or expired) now: the next try takes it.
    Job.objects.filter(pk=holder.pk).update(status="succeeded", lease_token=None, lease_expires_at=None)
    triage.Lock.objects.update(expires_at=timezone.now() - datetime.timedelta(seconds=1))
    Job.objects.filter(pk=job.pk).update(lock_contentions=triage.CONTENTIONS)
    assert health.queue_health().causes["accounts"] == []


def test_a_full_limit_a_pause_no_worker_stuck_jobs_and_a_backlog_are_named():
    for _ in range(4):
        tasks_flow.shared_a.enqueue(0)
    claimed = store.claim("default", ["flow-shared"], 10, "w", flow=registry.flow_plan())
    assert len(claimed) == 2  # flow-shared allows 2 at once: 2 running, 2 waiting
    tasks.add.using(queue_name="paused-q").enqueue(1)
    queues.pause("paused-q", actor="olga", reason="provider maintenance")
    late = tasks.add.using(queue_name="slow").enqueue(1)
    Job.objects.filter(pk=late.pk).update(run_after=timezone.now() - datetime.timedelta(minutes=5))
    gone = tasks.add.using(queue_name="slow").enqueue(2)
    Job.objects.filter(pk=gone.pk).update(
        status="running", worker_id="gone", lease_token="0" * 32, lease_expires_at=timezone.now()
    )
    triage.live_worker(queues="flow-shared,paused-q")  # nobody serves "slow"
    report = health.queue_health()

    [limit] = report.causes["flow-shared"]
    assert (limit.kind, limit.severity) == ("limit", health.WARNING)
    assert limit.text == "limit flow-shared full: 2 of 2 running (2 due jobs wait)"
    [paused] = report.causes["paused-q"]
    assert paused.kind == "paused" and paused.text.startswith("paused by olga ")
    assert paused.text.endswith(" ago: provider maintenance")
    slow = {cause.kind: cause for cause in report.causes["slow"]}
    assert set(slow) == {"no_worker", "stuck"}  # the backlog is explained by the missing worker
    assert slow["no_worker"].severity == slow["stuck"].severity == health.CRITICAL
    # The running count leaves out the job whose lease ended: that one is counted as stuck.
    assert slow["no_worker"].text == "no live worker serves this queue (1 due job, 0 running, 0 scheduled)"
    assert slow["stuck"].text == "1 running job past the lease: no live worker reaps them"
    # With a worker, the 5-minute-old due job is a backlog, and the reaper takes the stuck job.
    triage.live_worker("other:1:x", queues="slow")
    slow = {cause.kind: cause for cause in health.queue_health().causes["slow"]}
    assert set(slow) == {"backlog", "stuck"}
    assert slow["backlog"].text == "the oldest due job has waited 5 min (1 due job, 1 live worker)"
    assert slow["stuck"].severity == health.WARNING


def test_a_breaker_held_open_by_hand_says_by_whom_and_a_half_open_one_probes():
    triage.live_worker()
    triage.open_breaker()
    Breaker.objects.filter(name="flow-dep").update(
        manual=True, open_until=None, changed_by_name="olga", reason="carrier outage"
    )
    [cause] = health.queue_health().causes["flow-dep"]
    assert (
        cause.text
        == "breaker flow-dep open by hand by olga: carrier outage (4 due jobs wait until it is closed)"
    )
    Breaker.objects.filter(name="flow-dep").update(state="half_open", manual=False)
    [cause] = health.queue_health().causes["flow-dep"]
    assert (cause.severity, cause.text) == (
        health.WARNING,
        "breaker flow-dep half-open: probing (4 due jobs wait)",
    )
    Breaker.objects.filter(name="flow-dep").update(state="closed")
    # Closed, nothing holds the jobs back any more: what is left is a backlog to drain.
    [cause] = health.queue_health().causes["flow-dep"]
    assert (cause.kind, cause.severity) == ("backlog", health.WARNING)


def rows_in_order(html):
    return re.findall(r'<tr id="queue-([^"]+)"', html)


def test_the_page_ranks_names_the_causes_and_links_every_count(viewer):
    triage.incident()
    html = viewer.get(URL).content.decode()
    assert rows_in_order(html)[:3] == ["flow-dep", "accounts", "emails"]
    row = re.search(r'<tr id="queue-accounts".*?</tr>', html, re.S).group(0)
    assert 'class="critical"' in row and "with its holder gone" in row and "runbook: stuck-locks" in row
    assert (
        'href="/admin/jobguard/lock/?q=jobguard%3Alock%3Aaccount%3A999"' in row
        or "/admin/jobguard/lock/?q=" in row
    )
    row = re.search(r'<tr id="queue-flow-dep".*?</tr>', html, re.S).group(0)
    assert 'href="/admin/jobguard/breaker/#breaker-flow-dep"' in row and "next probe in" in row
    healthy = re.search(rf'<tr id="queue-{triage.HEALTHY[0]}".*?</tr>', html, re.S).group(0)
    assert "nothing held back" in healthy and 'class=""' in healthy

    # Every non-zero count is a link, and the list it opens holds that many.
    links = re.findall(r'data-count="([a-z-]+)"><a href="([^"]+)">(\d+)</a></', html)
    assert {name for name, _url, _n in links} >= {"depth", "dead", "failed", "succeeded"}
    for name, url, n in links:
        url = url.replace("&amp;", "&")
        response = viewer.get(url)
        assert response.status_code == 200, url
        query = parse_qs(urlsplit(url).query)
        assert "queue_name" in query, url
        shown = response.context["cl"].result_count  # the paginator's markup differs by Django version
        if name != "succeeded":  # every succeeded job of the queue, not the last hour's only
            assert shown == int(n), (name, url, shown)
    # No zero is a link.
    assert not re.search(r'<a href="[^"]+">0</a>', html)


def troubles(first, count):
    """``count`` more queues in trouble, each with its own contended lock and dead letter."""
    for n in range(first, first + count):
        triage.contended_lock(queue=f"locked-{n}")
        triage.dead_letters(queue=f"locked-{n}", count=1)
        if n:  # only account:999 has a held lock row
            Job.objects.filter(queue_name=f"locked-{n}", status="queued").update(lock_key=f"account:{n}")


def test_the_triage_costs_a_fixed_number_of_queries_however_many_queues_are_in_trouble(viewer):
    triage.live_worker()
    triage.healthy()
    triage.open_breaker()
    troubles(0, 13)
    queues.pause("locked-0", actor="x", reason="why")
    viewer.get(URL)  # session and permission caches warm alike for both runs
    with CaptureQueriesContext(connection) as thirteen:
        html = viewer.get(URL).content.decode()
    assert html.count("with its holder gone") == 1
    assert html.count('data-severity="critical"') == 14  # 13 locked queues and the breaker's
    troubles(13, 13)
    with CaptureQueriesContext(connection) as twenty_six:
        html = viewer.get(URL).content.decode()
    assert html.count('data-severity="critical"') == 27
    assert len(twenty_six.captured_queries) == len(thirteen.captured_queries)
    ours = [q["sql"] for q in twenty_six.captured_queries if "jobguard_" in q["sql"]]
    # At most every read the causes may make, plus the page's recent pause events.
    assert len(ours) <= health.QUERIES + 1, "\n".join(ours)
