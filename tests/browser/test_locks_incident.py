"""The Locks page under an incident, in a real browser: a worker SIGKILLed while its job holds a
long-TTL lock, a second job contending for it. The page names the dead holder, not the contender."""

from __future__ import annotations

import re

import pytest

from django_jobguard.models import Job
from tests.browser.conftest import CHROMIUM, follow, log_in, person, shot
from tests.conftest import wait_for
from tests.testapp import tasks_locks
from tests.testapp.models import Execution

sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright: pip install --group browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]

LOCKS = "/admin/jobguard/lock/"


def test_the_lock_page_names_the_sigkilled_holder_and_says_it_is_gone(live_server, workers, browser_page):
    person("lena", "view_lock", "view_job", "force_release_lock")
    holder_job = tasks_locks.hold_long.enqueue("incident", marker="holder", seconds=600)
    holder = workers.start("--worker-id", "holder-worker")
    wait_for(
        lambda: Execution.objects.filter(marker="holder").exists(), timeout=120, message="the holder to run"
    )
    holder.kill()  # SIGKILL: the lock stays until its 300 s TTL
    holder.wait(timeout=10)
    contender_job = tasks_locks.hold_long.enqueue("incident", marker="contender", seconds=0)
    workers.start("--worker-id", "contender-worker")
    wait_for(
        lambda: Job.objects.get(pk=contender_job.pk).lock_contentions >= 1,
        timeout=120,
        message="the second job to contend",
    )

    page = browser_page
    log_in(page, live_server.url, "lena", then=LOCKS)
    row = page.locator("#result_list tbody tr", has_text="res:incident")

    def named_and_gone() -> bool:
        page.reload()
        return 'alt="True"' in (row.locator("td.field-holder_gone").inner_html() or "")

    wait_for(named_and_gone, timeout=90, interval=2, message="the page to mark the dead holder gone")
    holder_cell = row.locator("td.field-holder").inner_text()
    assert re.search(rf"#{holder_job.pk}\s+holder-worker", holder_cell)
    assert f"#{contender_job.pk}" not in row.inner_text()
    assert 'alt="True"' in row.locator("td.field-stuck").inner_html()
    assert row.locator("td.field-contention").inner_text().startswith("1 (")

    follow(page, "#result_list tbody tr:has-text('res:incident') th a")
    assert "holder-worker" in page.inner_text("body") and "it is gone" in page.inner_text("body")
    shot(page, "lock-dead-holder")
    follow(page, "#force-release")
    assert page.locator("#holder-gone").is_visible()
    assert f"#{holder_job.pk}" in page.inner_text("#holder")
