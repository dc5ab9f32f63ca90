"""An incident's replays in a real browser: a requester takes a batch of the dead letters and
corrects them all with one JSON Patch, an approver reads each correction's path diff and
approves the batch, and the redrive rate, changed from the console, paces a real worker."""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone

from django_jobguard.models import DeadLetter, ReplayRateChange
from tests.browser.conftest import CHROMIUM, follow, log_in, person, shot
from tests.conftest import wait_for
from tests.support.factories import make_dead_letters
from tests.testapp.models import LedgerEntry

sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright: pip install --group browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]

LIST = "/admin/jobguard/deadletter/"
RATE = "/admin/jobguard/deadletter/redrive-rate/"
BATCH = 10
PATCH = '[{"op": "replace", "path": "/kwargs/amount", "value": 500}]'


def choose(page, action):
    page.check("#action-toggle")
    page.select_option("select[name=action]", action)
    follow(page, "button[name=index]")


def set_rate(page, url, rate, reason):
    page.goto(f"{url}{RATE}")
    page.fill("#id_rate_per_minute", str(rate))
    page.fill("#id_reason", reason)
    follow(page, "#rate-form input[type=submit]")
    assert f"Redrive rate set to {rate}/min" in page.inner_text(".messagelist")


def test_a_corrected_batch_is_requested_and_approved_and_the_drain_follows_the_console_rate(
    live_server, workers, browser_page
):
    failed = timezone.now() - datetime.timedelta(hours=1)
    make_dead_letters(
        BATCH + 5,
        kwargs=lambda n: {"order_id": 50_000 + n, "amount": 0},
        failed_at=failed,
        spread_seconds=1,
        error_class="PermanentError",
    )
    oldest = set(DeadLetter.objects.order_by("last_failed_at", "id").values_list("pk", flat=True)[:BATCH])
    person("rita", "view_deadletter", "request_replay", "view_payload")
    person("alex", "view_deadletter", "approve_replay", "view_payload")
    page = browser_page

    # Rita takes the first 10 failures as a batch, counts them, and corrects them all at once.
    log_in(page, live_server.url, "rita")
    choose(page, "request_replays")
    assert "15 dead letters selected" in page.inner_text("#bulk-count")
    page.fill("#id_batch-first", str(BATCH))
    follow(page, "#batch-preview")
    assert f"{BATCH} dead letters selected" in page.inner_text("#bulk-count")
    assert "A batch of the 15 matching the filter" in page.inner_text("#bulk-count")
    page.fill("textarea[name=patch]", PATCH)
    page.fill("textarea[name=reason]", "incident 7: amounts were sent as 0")
    follow(page, "input[type=submit].default")
    assert f"Request replay: {BATCH} done with the correction." in page.inner_text(".messagelist")
    requested = DeadLetter.objects.filter(replay_state="requested")
    assert set(requested.values_list("pk", flat=True)) == oldest

    # Alex slows the drain first, then reads each correction's path diff and approves the batch.
    log_in(page, live_server.url, "alex")
    set_rate(page, live_server.url, 1, "one at a time while we watch")
    page.goto(f"{live_server.url}{LIST}?replay_state__exact=requested")
    choose(page, "approve_replays")
    assert page.locator("#bulk-corrected-list li.corrected-letter").count() == BATCH
    rows = page.locator("#bulk-corrected-list tr.correction-change")
    assert rows.count() == BATCH
    assert [c.strip() for c in rows.nth(0).locator("td").all_inner_texts()] == ["amount", "0", "500"]
    shot(page, "bulk-approval-corrected-batch")
    page.fill("textarea[name=reason]", "500 is each order's total")
    follow(page, "input[type=submit].default")
    assert f"Approve replay: {BATCH} done." in page.inner_text(".messagelist")

    # A real worker drains them at the console's rate: at 1 a minute, its first pass redrives one
    # (at the configured 60 a minute it would have redriven all ten in that pass).
    worker = workers.start()
    workers.wait_started(worker)
    replayed = DeadLetter.objects.filter(replay_state="replayed")
    wait_for(lambda: replayed.exists(), timeout=120, message="the first redrive")
    assert replayed.count() == 1
    # Alex raises the rate; every worker's next pass follows it: the other nine are redriven
    # well within the nine minutes 1 a minute would take.
    set_rate(page, live_server.url, 600, "provider confirmed the fix")
    raised = ReplayRateChange.objects.get(rate_per_minute=600).created_at
    wait_for(lambda: replayed.count() == BATCH, timeout=150, message="the batch to be redriven at 600/min")
    assert replayed.filter(replayed_at__lt=raised).count() == 1
    wait_for(
        lambda: LedgerEntry.objects.filter(amount=500).count() == BATCH,
        timeout=120,
        message="the corrected charges",
    )
    assert set(LedgerEntry.objects.values_list("effect_key", flat=True)) == {
        f"charge:{order}"
        for order in DeadLetter.objects.filter(pk__in=oldest).values_list("kwargs__order_id", flat=True)
    }
    page.goto(f"{live_server.url}{RATE}")
    history = page.inner_text("#rate-history")
    assert "provider confirmed the fix" in history and "one at a time while we watch" in history
