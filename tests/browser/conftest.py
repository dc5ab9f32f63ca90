"""What the browser tests share: Debian's Chromium through Playwright, and screenshots."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.db import connections

CHROMIUM = Path("/usr/bin/chromium")
#: The password of every person(): they log in through the login form.
PASSWORD = "console-test"  # noqa: S105 - a test user's
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
DOC_IMAGES = ROOT / "docs" / "images"
#: The screenshots docs/how-to/operate-the-admin.md shows.
DOC_SHOTS = {
    "queue-triage",
    "queue-health-paused",
    "job-list",
    "workers",
    "dead-letter-detail",
    "job-timeline",
    "bulk-approval-corrected-batch",
}
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def browser_page(monkeypatch):
    # Playwright's sync API runs an event loop in this thread; the live server's ORM calls
    # happen in its own thread, but pytest-django's fixtures here would trip Django's guard.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="needs playwright: pip install --group browser"
    )
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        context = browser.new_context(viewport={"width": 1366, "height": 900})
        page = context.new_page()
        page.set_default_timeout(30_000)
        try:
            yield page
        finally:
            context.close()
            browser.close()
            # Inside Playwright's event loop the ORM gets connections of their own (Django's
            # connections are context-local): close them, or the test database cannot be dropped.
            connections.close_all()


def person(name, *codenames):
    """A staff user with the jobguard permissions named by ``codenames``, who logs in with the form."""
    from tests.support.factories import make_user  # models: imported once Django is set up

    return make_user(name, *codenames, password=PASSWORD)


def log_in(page, url, name, then="/admin/jobguard/deadletter/"):
    """Log ``name`` in on a fresh session and land on ``then``."""
    page.context.clear_cookies()
    page.goto(f"{url}/admin/login/?next={then}")
    page.fill("#id_username", name)
    page.fill("#id_password", PASSWORD)
    follow(page, "input[type=submit]")


def follow(page, selector):
    """Click what loads a new page, and return once that page has loaded.

    A click returns once the navigation starts, and ``locator.count()`` does not wait: counted
    right after a click, the old page (or half the new one) would be counted.
    """
    with page.expect_navigation():
        page.click(selector)


def shot(page, name, *, full_page=True):
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    if os.environ.get("JOBGUARD_UPDATE_DOC_IMAGES") == "1" and name in DOC_SHOTS:
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, DOC_IMAGES / path.name)
    return path
