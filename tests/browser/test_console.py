"""End to end in a real browser: an operator watches the queue health page, pauses a queue,
sees its depth grow while a real worker claims nothing from it, and resumes it.

Playwright drives the system's Chromium (``/usr/bin/chromium``; Playwright's own browser
download is not used). Screenshots of the pages land in ``artifacts/browser/``; the ones the
docs show are copied to ``docs/images/`` when ``JOBGUARD_UPDATE_DOC_IMAGES=1``. Run with
``pip install --group browser`` and ``pytest -m browser``.
"""

from __future__ import annotations

import datetime

import pytest

from django_jobguard.models import Job
from tests.browser.conftest import CHROMIUM, follow, log_in, person, shot
from tests.conftest import wait_for
from tests.testapp import tasks

sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright: pip install --group browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]


def row_text(page, queue):
    return page.locator(f"#queue-{queue}").inner_text()


def test_an_operator_pauses_a_queue_sees_it_fill_without_claims_and_resumes_it(
    live_server, workers, browser_page
):
    # view_payload: the job list below shows its widest column, the last error, only with it.
    person("operator", "view_job", "pause_queue", "view_workerbeat", "view_payload")
    worker = workers.start(
        "--worker-id", "w-browser", "--poll-interval", "0.2", "--queue", "held", "--queue", "free"
    )
    workers.wait_started(worker)
    page = browser_page

    log_in(page, live_server.url, "operator", then="/admin/")
    follow(page, "text=Queues")  # linked from the admin index
    assert page.url.endswith("/admin/jobguard/queuestate/")

    # The page lists every queue with jobs: "held" has one scheduled for later.
    tasks.add.using(queue_name="held", run_after=datetime.timedelta(hours=1)).enqueue(0)
    page.reload()
    page.click("#queue-held details.claims-change summary")  # the compact control opens
    page.fill("#queue-held input[name=reason]", "provider returns 503")
    follow(page, "#queue-held button[name=pause]")
    assert "Queue 'held' paused." in page.inner_text(".messagelist")
    assert "paused" in row_text(page, "held") and "provider returns 503" in row_text(page, "held")

    waiting = [tasks.add.using(queue_name="held").enqueue(n, 1) for n in range(3)]
    sibling = tasks.add.using(queue_name="free").enqueue(7)
    wait_for(
        lambda: Job.objects.get(pk=sibling.pk).status == "succeeded", timeout=60, message="the free queue"
    )
    page.reload()
    assert page.locator("#queue-held .depth").inner_text() == "3"  # the depth grew
    assert page.locator("#queue-held .in-flight").inner_text() == "0"  # and nothing is claimed
    assert set(Job.objects.filter(pk__in=[j.pk for j in waiting]).values_list("status", "attempts")) == {
        ("queued", 0)
    }
    shot(page, "queue-health-paused")

    page.click("#queue-held details.claims-change summary")
    follow(page, "#queue-held button[name=resume]")
    assert "Queue 'held' resumed." in page.inner_text(".messagelist")
    wait_for(
        lambda: Job.objects.filter(pk__in=[j.pk for j in waiting], status="succeeded").count() == 3,
        timeout=60,
        message="the resumed queue's jobs",
    )
    page.reload()
    assert page.locator("#queue-held .depth").inner_text() == "0"
    assert "accepting" in row_text(page, "held")
    shot(page, "queue-health")

    # The job list fits a 1,366 px laptop screen once the admin's side bar is closed.
    page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page.goto(f"{live_server.url}/admin/jobguard/job/")
    assert page.locator(".jobguard-badge.state-succeeded").count() >= 4
    last_column = page.locator("#result_list th.column-error_preview").bounding_box()
    assert last_column["x"] + last_column["width"] <= 1366, last_column
    shot(page, "job-list", full_page=False)  # the filter column runs far below the list
    page.goto(f"{live_server.url}/admin/jobguard/workerbeat/")
    wait_for(
        lambda: (page.reload(), "w-browser" in page.content())[1], timeout=30, message="the workers page"
    )
    assert page.locator(".state-live").count() == 1
    shot(page, "workers")


def test_the_health_page_does_not_reload_over_a_half_typed_reason(live_server, browser_page):
    person("typist", "view_job", "pause_queue")
    tasks.add.using(queue_name="typed", run_after=datetime.timedelta(hours=1)).enqueue(0)
    page = browser_page
    log_in(page, live_server.url, "typist", then="/admin/")
    page.goto(f"{live_server.url}/admin/jobguard/queuestate/?refresh=2")
    stamp = page.inner_text("#as-of")

    page.click("#queue-typed details.claims-change summary")
    page.fill("#queue-typed input[name=reason]", "half a reas")
    # The reload came due and waited: the note says so, and the text is still there.
    page.wait_for_selector("#refresh-note", state="visible", timeout=60_000)
    assert page.input_value("#queue-typed input[name=reason]") == "half a reas"
    assert page.inner_text("#as-of") == stamp

    # Once the field is empty, has no focus and the control is closed, the page reloads on its own.
    with page.expect_navigation(timeout=60_000):
        page.fill("#queue-typed input[name=reason]", "")
        page.locator("#queue-typed input[name=reason]").blur()
        page.click("#queue-typed details.claims-change summary")
    assert page.locator("#refresh-note").is_hidden()
