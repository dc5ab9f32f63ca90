"""End to end in a real browser: a requester corrects one dead letter's payload and requests a
bulk replay of the others, an approver reads the correction's diff and approves, a worker
process redrives, the dead letters read "replayed", and a job's page tells the whole story."""

from __future__ import annotations

import re
import time

import pytest

from django_jobguard.models import DeadLetter, Job
from tests.browser.conftest import CHROMIUM, follow, log_in, person, shot
from tests.support.dlq import run_burst
from tests.testapp import tasks_dlq
from tests.testapp.models import LedgerEntry

sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright: pip install --group browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]

LIST = "/admin/jobguard/deadletter/"


def bulk(page, action, reason):
    page.check("#action-toggle")  # every dead letter the filter shows
    page.select_option("select[name=action]", action)
    follow(page, "button[name=index]")
    page.fill("textarea[name=reason], input[name=reason]", reason)
    follow(page, "input[type=submit].default")


def dead_after_retries(marker):
    """A job that failed three times, with its backoffs, until it was dead-lettered."""
    job = tasks_dlq.always_transient.enqueue(marker=marker)
    for _ in range(200):
        assert run_burst() == 0
        job.refresh_from_db()
        if job.status == "dead":
            return job
        time.sleep(0.05)
    pytest.fail(f"job {job.pk} still {job.status}")


def correction(page):
    """(argument, original, corrected) of each row of the correction's diff on the page."""
    rows = page.locator("#payload-correction tr.correction-change")
    return [
        tuple(rows.nth(n).locator("td").nth(col).inner_text().strip() for col in range(3))
        for n in range(rows.count())
    ]


def test_a_requester_and_an_approver_replay_dead_letters_that_a_worker_redrives(
    live_server, workers, browser_page
):
    for order_id in (1, 2):
        tasks_dlq.charge.enqueue(order_id=order_id, amount=0)
    assert workers.burst().returncode == 0
    retried = dead_after_retries("browser")
    assert DeadLetter.objects.filter(replay_state="none").count() == 3
    person("rita", "view_deadletter", "request_replay", "view_payload")
    person("alex", "view_deadletter", "approve_replay", "view_payload", "view_job")
    first = DeadLetter.objects.get(task_name=tasks_dlq.charge.name, kwargs__order_id=1)
    page = browser_page

    # Rita corrects the amount of order 1 on its dead letter, then requests the others in bulk.
    log_in(page, live_server.url, "rita")
    page.goto(f"{live_server.url}{LIST}{first.pk}/change/")
    follow(page, ".object-tools a:has-text('Request replay')")
    kwargs = page.locator("textarea[name=kwargs]")
    assert '"amount": 0' in kwargs.input_value()
    kwargs.fill('{"amount": 500, "order_id": 1}')
    page.fill("textarea[name=reason]", "amount corrected from the order")
    follow(page, "input[type=submit].default")
    assert "Replay requested" in page.inner_text(".messagelist")
    page.goto(f"{live_server.url}{LIST}?replay_state__exact=none")
    bulk(page, "request_replays", "after the payment fix")
    assert "2 done" in page.inner_text(".messagelist")

    # Alex reads the correction before approving it: on the dead letter and on the approval form.
    log_in(page, live_server.url, "alex")
    page.goto(f"{live_server.url}{LIST}{first.pk}/change/")
    assert correction(page) == [("amount", "0", "500")]
    shot(page, "dead-letter-detail")
    follow(page, ".object-tools a:has-text('Approve replay')")
    assert correction(page) == [("amount", "0", "500")]
    assert "amount corrected from the order" in page.inner_text("#content-main")
    page.fill("textarea[name=reason]", "500 is the order's total")
    follow(page, "input[type=submit].default")
    assert "Replay approved" in page.inner_text(".messagelist")
    page.goto(f"{live_server.url}{LIST}?replay_state__exact=requested")
    bulk(page, "approve_replays", "checked the fix")
    assert "2 done" in page.inner_text(".messagelist")

    # A worker process redrives the approved replays (within the replay throttle).
    for _ in range(10):
        assert workers.burst().returncode == 0
        if DeadLetter.objects.filter(replay_state="replayed").count() == 3:
            break
    page.goto(f"{live_server.url}{LIST}?replay_state__exact=replayed")
    assert page.locator("#result_list tbody tr").count() == 3
    assert set(
        DeadLetter.objects.filter(job__isnull=False, replay_job__isnull=False).values_list(
            "replay_state", flat=True
        )
    ) == {"replayed"}
    assert LedgerEntry.objects.filter(effect_key="charge:1", amount=500).count() == 1  # the correction ran

    # The retried job's page: its attempts, their backoff, the dead letter and the replay.
    letter = DeadLetter.objects.get(job=retried)
    page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page.goto(f"{live_server.url}/admin/jobguard/job/{retried.pk}/change/")
    kinds = page.locator("#job-timeline tbody tr").evaluate_all("rows => rows.map(r => r.className)")
    assert kinds == [
        f"step step-{kind}"
        for kind in (
            "enqueued",
            "attempt",
            "backoff",
            "attempt",
            "backoff",
            "attempt",
            "dead_letter",
            "replay_requested",
            "replay_approved",
            "replay_replayed",
        )
    ]
    assert page.locator("#job-timeline .outcome-failed").count() == 3
    assert "rita" in page.inner_text("#job-timeline tr.step-replay_requested")
    assert "alex" in page.inner_text("#job-timeline tr.step-replay_approved")
    assert re.search(r"\d\d:\d\d:\d\d UTC", page.inner_text("#job-timeline tr.step-attempt >> nth=0"))
    shot(page, "job-timeline", full_page=False)  # the timeline; the row's fields follow below
    follow(page, f"#job-timeline tr.step-replay_replayed a[href$='/job/{letter.replay_job_id}/change/']")
    assert page.locator("#job-timeline tr.step-replay_of").count() == 1
    assert Job.objects.filter(pk=letter.replay_job_id).exists()
