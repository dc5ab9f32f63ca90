"""The console by keyboard and by eye, in a real browser: the replay forms start in their
reason, and no empty error box shows."""

from __future__ import annotations

import pytest

from django_jobguard import dlq
from django_jobguard.models import DeadLetter
from tests.browser.conftest import CHROMIUM, follow, log_in, person
from tests.support.dlq import dead_charge

sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright: pip install --group browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]

LIST = "/admin/jobguard/deadletter/"


def focused(page):
    return page.evaluate("document.activeElement && document.activeElement.name || ''")


def test_an_approver_approves_by_keyboard_from_the_reason_field(live_server, browser_page):
    letters = [dead_charge(order_id=70 + n, amount=0) for n in range(3)]
    rita = person("rita", "view_deadletter", "request_replay", "view_payload")
    person("alex", "view_deadletter", "approve_replay", "view_payload", "view_job")
    for letter in letters:
        dlq.request_replay(letter, rita, "after the fix")
    page = browser_page

    # The request form: no empty red box above it (the size note stays hidden until needed).
    log_in(page, live_server.url, "rita")
    other = dead_charge(order_id=79, amount=0)
    page.goto(f"{live_server.url}{LIST}{other.pk}/replay/request/")
    assert page.locator("#payload-too-big").count() == 1
    assert not page.locator("#payload-too-big").is_visible()
    assert focused(page) == "reason"

    # One dead letter: type the reason where the page starts, Tab to the button, Enter.
    log_in(page, live_server.url, "alex")
    page.goto(f"{live_server.url}{LIST}{letters[0].pk}/replay/approve/")
    assert focused(page) == "reason"
    page.keyboard.type("checked the fix")
    presses = 0
    while page.evaluate("document.activeElement.type") != "submit" and presses < 10:
        page.keyboard.press("Tab")
        presses += 1
    assert presses <= 2, presses
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert "Replay approved" in page.inner_text(".messagelist")

    # Bulk: the confirmation starts in its reason too.
    page.goto(f"{live_server.url}{LIST}?replay_state__exact=requested")
    page.check("#action-toggle")
    page.select_option("select[name=action]", "approve_replays")
    follow(page, "button[name=index]")
    assert focused(page) == "reason"
    page.keyboard.type("checked the fix")
    follow(page, "input[type=submit].default")
    assert "2 done" in page.inner_text(".messagelist")
    assert set(
        DeadLetter.objects.filter(pk__in=[x.pk for x in letters]).values_list("replay_state", flat=True)
    ) <= {
        "approved",
        "replayed",
    }
