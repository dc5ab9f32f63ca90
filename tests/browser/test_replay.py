"""End to end in a real browser: a requester filters dead letters and requests a bulk replay, an
approver approves it, a worker process redrives, and the dead letters read "replayed"."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

from django_jobguard.models import DeadLetter
from tests.browser.conftest import CHROMIUM, shot
from tests.testapp import tasks_dlq

sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright: pip install --group browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]

LIST = "/admin/jobguard/deadletter/"


def person(name, *codenames):
    user = User.objects.create_user(name, password="console-test", is_staff=True)  # noqa: S106
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def log_in(page, url, name):
    page.context.clear_cookies()
    page.goto(f"{url}/admin/login/?next={LIST}")
    page.fill("#id_username", name)
    page.fill("#id_password", "console-test")
    page.click("input[type=submit]")


def bulk(page, action, reason):
    page.check("#action-toggle")  # every dead letter the filter shows
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")
    page.fill("textarea[name=reason], input[name=reason]", reason)
    page.click("input[type=submit].default")


def test_a_requester_and_an_approver_replay_dead_letters_that_a_worker_redrives(
    live_server, workers, browser_page
):
    for order_id in (1, 2):
        tasks_dlq.charge.enqueue(order_id=order_id, amount=0)
    assert workers.burst().returncode == 0
    assert DeadLetter.objects.filter(replay_state="none").count() == 2
    person("rita", "view_deadletter", "request_replay")
    person("alex", "view_deadletter", "approve_replay")
    page = browser_page

    log_in(page, live_server.url, "rita")
    page.goto(f"{live_server.url}{LIST}?replay_state__exact=none")
    bulk(page, "request_replays", "after the payment fix")
    assert "2 done" in page.inner_text(".messagelist")

    log_in(page, live_server.url, "alex")
    page.goto(f"{live_server.url}{LIST}?replay_state__exact=requested")
    letter = DeadLetter.objects.order_by("id").first()
    page.goto(f"{live_server.url}{LIST}{letter.pk}/change/")
    shot(page, "dead-letter-detail")
    page.goto(f"{live_server.url}{LIST}?replay_state__exact=requested")
    bulk(page, "approve_replays", "checked the fix")
    assert "2 done" in page.inner_text(".messagelist")

    assert workers.burst().returncode == 0  # a worker process redrives the approved replays
    page.goto(f"{live_server.url}{LIST}?replay_state__exact=replayed")
    assert page.locator("#result_list tbody tr").count() == 2
    assert set(
        DeadLetter.objects.filter(job__isnull=False, replay_job__isnull=False).values_list(
            "replay_state", flat=True
        )
    ) == {"replayed"}
