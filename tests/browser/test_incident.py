"""The console under an incident, in a real browser: thousands of dead letters replayed with
"Select all", a nested correction's diff, and the health page after the only worker died."""

from __future__ import annotations

import re
import time

import pytest
from django.utils import timezone

from django_jobguard import dlq
from django_jobguard.models import DeadLetter
from tests.browser.conftest import CHROMIUM, follow, log_in, person, shot
from tests.conftest import wait_for
from tests.support.factories import make_dead_letter, make_dead_letters
from tests.testapp import tasks, tasks_dlq

sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright: pip install --group browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]

LIST = "/admin/jobguard/deadletter/"
#: Five times Django's DATA_UPLOAD_MAX_NUMBER_FIELDS: one form field per row could never carry them.
MANY = 5_000


#: How long one bulk request may take: thousands of transitions, each in its own transaction.
BULK_DEADLINE_MS = 600_000


def confirm_bulk(page):
    """Submit the confirmation and wait for the page that reports what was done."""
    started = time.monotonic()
    with page.expect_navigation(timeout=BULK_DEADLINE_MS):
        page.click("input[type=submit].default", no_wait_after=True)
    print(f"bulk request: {time.monotonic() - started:.1f} s")  # the figure for the notes (pytest -s)


def select_all_and_run(page, action, reason):
    """Tick every row, take "Select all N", run the action and confirm it with a reason."""
    page.check("#action-toggle")
    page.click("div.actions a:has-text('Select all')")
    page.select_option("select[name=action]", action)
    follow(page, "button[name=index]")
    page.fill("textarea[name=reason], input[name=reason]", reason)
    confirm_bulk(page)


def test_five_thousand_dead_letters_are_requested_and_approved_with_select_all(live_server, browser_page):
    make_dead_letters(MANY)
    person("rita", "view_deadletter", "request_replay")
    person("alex", "view_deadletter", "approve_replay")
    page = browser_page

    log_in(page, live_server.url, "rita")
    page.goto(f"{live_server.url}{LIST}?replay_state__exact=none")
    page.check("#action-toggle")
    page.click("div.actions a:has-text('Select all')")
    page.select_option("select[name=action]", "request_replays")
    follow(page, "button[name=index]")
    confirm = page.inner_text("#content-main")
    assert f"{MANY} dead letters selected" in confirm
    assert "shows the first 50" in confirm
    page.fill("textarea[name=reason], input[name=reason]", "the provider is back")
    confirm_bulk(page)
    assert f"{MANY} done" in page.inner_text(".messagelist")
    assert DeadLetter.objects.filter(replay_state="requested").count() == MANY

    log_in(page, live_server.url, "alex")
    page.goto(f"{live_server.url}{LIST}?replay_state__exact=requested")
    select_all_and_run(page, "approve_replays", "checked the provider's status page")
    assert f"{MANY} done" in page.inner_text(".messagelist")
    assert DeadLetter.objects.filter(replay_state="approved").count() == MANY
    assert DeadLetter.objects.exclude(replay_decided_by__username="alex").count() == 0


def test_a_nested_correction_shows_only_what_changed(live_server, browser_page):
    order = {"lines": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}], "note": "leave at door"}
    make_dead_letters(1, kwargs=lambda n: {"order_id": 7, "order": order}, task_name=tasks_dlq.fulfil.name)
    letter = DeadLetter.objects.get()
    rita = person("rita", "view_deadletter", "request_replay", "view_payload")
    person("alex", "view_deadletter", "approve_replay", "view_payload")
    corrected = {
        "order_id": 7,
        "order": {**order, "lines": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 30}]},
    }
    dlq.request_replay(letter, rita, "qty from the order", kwargs=corrected)

    page = browser_page
    log_in(page, live_server.url, "alex", then=f"{LIST}{letter.pk}/change/")
    rows = page.locator("#payload-correction tr.correction-change")
    seen = [
        tuple(rows.nth(n).locator("td").nth(col).inner_text().strip() for col in range(3))
        for n in range(rows.count())
    ]
    # One change, at its path; the unchanged line, skus, note and order_id are not listed.
    assert seen == [("order.lines[1].qty", "2", "30")], seen
    shot(page, "nested-correction")
    follow(page, ".object-tools a:has-text('Approve replay')")
    rows = page.locator("#payload-correction tr.correction-change")
    assert rows.count() == 1 and "order.lines[1].qty" in rows.first.inner_text()


@pytest.mark.processes
def test_the_health_page_says_no_live_worker_and_counts_the_stuck_job_after_a_kill(
    live_server, workers, browser_page
):
    person("olga", "view_job", "view_workerbeat")
    job = tasks.short_lease_plain.enqueue("left-behind", seconds=120)
    worker = workers.start("--worker-id", "only-one", "--poll-interval", "0.2")
    wait_for(lambda: (job.refresh_from_db(), job.status)[1] == "running", timeout=60, message="the claim")
    page = browser_page
    log_in(page, live_server.url, "olga", then="/admin/jobguard/queuestate/")
    row = page.locator("#queue-default")
    assert "no live worker" not in row.inner_text()

    worker.kill()  # SIGKILL: no goodbye, its beat row just stops
    worker.wait(timeout=10)

    def dead_and_stuck():
        page.reload()
        text = row.inner_text()
        stuck = page.inner_text("#queue-default td.stuck").strip()
        return "no live worker" in text and stuck == "1"

    # The 2 s lease expires at once; the beat row is stale after three missed beats.
    wait_for(dead_and_stuck, timeout=120, message="the page to show the dead worker and the stuck job")
    assert re.search(r"\balarm\b", page.get_attribute("#queue-default td.workers", "class") or "")
    assert "alarm" in (page.get_attribute("#queue-default td.stuck", "class") or "")
    shot(page, "queue-health-dead-worker")


def test_the_console_pages_fit_common_screen_widths(live_server, browser_page):
    from django_jobguard.models import WorkerBeat

    person("vera", "view_job", "view_workerbeat", "pause_queue")
    now = timezone.now()
    for n in range(3):
        WorkerBeat.objects.create(
            worker_id=f"web-{n}.example.internal:{4000 + n}:abcdef",
            host=f"web-{n}.example.internal",
            pid=4000 + n,
            queues="default,emails,payments,reports",
            concurrency=8,
            started_at=now,
            last_beat_at=now,
        )
    tasks.add.using(queue_name="payments").enqueue(1)
    page = browser_page
    log_in(page, live_server.url, "vera", then="/admin/jobguard/workerbeat/")
    page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")

    page.set_viewport_size({"width": 1500, "height": 900})
    page.goto(f"{live_server.url}/admin/jobguard/workerbeat/")
    headers = page.locator("#result_list thead th")
    for n in range(headers.count()):
        box = headers.nth(n).bounding_box()
        assert box is not None and box["x"] + box["width"] <= 1500, (n, box)

    page.set_viewport_size({"width": 800, "height": 900})
    page.goto(f"{live_server.url}/admin/jobguard/queuestate/")
    # The page itself never scrolls sideways; the wide table scrolls inside its own box.
    assert page.evaluate("document.documentElement.scrollWidth") <= 800
    shot(page, "queue-health-800px", full_page=False)


def test_a_payload_over_djangos_upload_limit_is_stopped_with_the_reason_and_nothing_lost(
    live_server, browser_page, settings
):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 5_000
    make_dead_letter(kwargs={"order_id": 8, "amount": 0})
    letter = DeadLetter.objects.get()
    person("rita", "view_deadletter", "request_replay", "view_payload")
    page = browser_page
    log_in(page, live_server.url, "rita", then=f"{LIST}{letter.pk}/replay/request/")
    big = '{"order_id": 8, "amount": 5, "note": "' + "x" * 6_000 + '"}'
    page.fill("textarea[name=kwargs]", big)
    page.fill("textarea[name=reason]", "amount from the order")
    page.click("input[type=submit].default")
    page.wait_for_selector("#payload-too-big", state="visible", timeout=30_000)
    note = page.inner_text("#payload-too-big")
    assert "accepts at most 5,000 bytes" in note and "Nothing was sent" in note
    assert page.url.endswith("/replay/request/")
    assert page.input_value("textarea[name=kwargs]") == big  # what was typed is still there
    assert DeadLetter.objects.get(pk=letter.pk).replay_state == "none"

    # A payload that fits goes through as before.
    page.fill("textarea[name=kwargs]", '{"order_id": 8, "amount": 5}')
    follow(page, "input[type=submit].default")
    assert DeadLetter.objects.get(pk=letter.pk).replay_state == "requested"
