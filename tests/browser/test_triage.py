"""The queue health page as a triage page, in a real browser, in the shape of the round-3 incident.

Three faults among thirteen queues: a queue waiting behind an open breaker, a job put back
over a thousand times on a lock whose holder is gone, a queue dead-lettering. At 1280x800 all
three causes must be on the first screen, without scrolling; at 390 px the key columns (queue,
causes, due now) must still be in view. The rows are real (tests/support/triage.py).
"""

from __future__ import annotations

import pytest

from django_jobguard.registry import registry
from tests.browser.conftest import CHROMIUM, follow, log_in, person, shot
from tests.support import triage
from tests.testapp import tasks_flow

sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright: pip install --group browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]

URL = "/admin/jobguard/queuestate/"


@pytest.fixture
def flow_tasks():
    for task in tasks_flow.ALL:
        registry.register(task)
    yield
    for task in tasks_flow.ALL:
        registry.unregister(task.name)


def in_viewport(page, selector):
    """Whether the element is wholly inside the viewport as the page first shows it."""
    box = page.locator(selector).bounding_box()
    size = page.viewport_size
    return (
        box is not None
        and box["x"] >= 0
        and box["y"] >= 0
        and box["x"] + box["width"] <= size["width"]
        and box["y"] + box["height"] <= size["height"]
    ), box


def test_the_triage_page_names_all_three_causes_on_one_screen(live_server, browser_page, flow_tasks):
    triage.incident()
    person("olga", "view_job", "view_deadletter", "view_breaker", "view_lock", "pause_queue")
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 800})
    log_in(page, live_server.url, "olga", then=URL)
    assert page.evaluate("window.scrollY") == 0

    causes = {
        "flow-dep": ("li.cause-breaker", "breaker flow-dep open, next probe in"),
        "accounts": ("li.cause-lock", "lock account:999 contended 1,074 times"),
        "emails": ("li.cause-dead_lettered", "3 jobs dead-lettered in the last hour"),
    }
    for queue, (selector, words) in causes.items():
        cause = f"#queue-{queue} {selector}"
        assert words in page.inner_text(cause), (queue, page.inner_text(cause))
        visible, box = in_viewport(page, cause)
        assert visible, (queue, box)
    assert "with its holder gone" in page.inner_text("#queue-accounts li.cause-lock")
    # The table fits the width: the page does not scroll sideways, nor does the table's box.
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    shot(page, "queue-triage", full_page=False)
    box = page.locator("#queue-health").bounding_box()
    assert box is not None and box["x"] + box["width"] <= 1280, box
    shot(page, "queue-triage", full_page=False)

    # A cause links to where its jobs are: the breaker's row on the breakers page.
    follow(page, "#queue-flow-dep li.cause-breaker a")
    assert page.url.endswith("/admin/jobguard/breaker/#breaker-flow-dep")

    # On a phone the key columns stay in view: the queue, its causes and the due count.
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{live_server.url}{URL}")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    for column in ("th", "td.causes", "td.depth"):
        visible, box = in_viewport(page, f"#queue-flow-dep {column}")
        assert visible, (column, box)
    assert page.locator("#queue-flow-dep td.scheduled").is_hidden()
    shot(page, "queue-triage-390px", full_page=False)
