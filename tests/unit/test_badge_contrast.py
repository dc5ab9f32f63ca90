"""The console's colours meet WCAG AA (4.5:1 for text), and each job state has its own badge colour.

The ratios are computed from the colours the pages use (the badges as rendered, the templates'
CSS), so a low-contrast or shared colour picked later fails here.
"""

import itertools
import re
from pathlib import Path

import pytest
from django.contrib import admin
from django.utils import timezone

from django_jobguard.admin import jobs as job_admin
from django_jobguard.models import Job, JobStatus

TEMPLATES = Path(job_admin.__file__).resolve().parent.parent / "templates" / "django_jobguard" / "admin"
#: The admin's page backgrounds: light (Django's --body-bg) and dark.
WHITE, DARK = "#ffffff", "#121212"
AA = 4.5


def luminance(colour: str) -> float:
    digits = colour.lstrip("#")
    if len(digits) == 3:
        digits = "".join(c * 2 for c in digits)
    channels = [int(digits[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    light, dark = sorted([luminance(a), luminance(b)], reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_the_contrast_formula_matches_wcags_examples():
    assert contrast("#000", "#fff") == pytest.approx(21.0)
    assert contrast("#777777", "#ffffff") == pytest.approx(4.48, abs=0.01)
    assert contrast("#b36b00", "#ffffff") == pytest.approx(4.18, abs=0.01)  # the old retry amber


def job_in(state: str) -> Job:
    now = timezone.now()
    later = now + timezone.timedelta(hours=1)
    fields = {
        JobStatus.WAITING: {"status": JobStatus.WAITING},
        "due": {"status": JobStatus.QUEUED, "run_after": now},
        "scheduled": {"status": JobStatus.QUEUED, "run_after": later},
        "retrying": {"status": JobStatus.QUEUED, "run_after": later, "first_failed_at": now},
        JobStatus.RUNNING: {"status": JobStatus.RUNNING, "lease_expires_at": later},
        "stuck": {"status": JobStatus.RUNNING, "lease_expires_at": now - timezone.timedelta(minutes=1)},
    }.get(state, {"status": state})
    return Job(task_name="t.x", cancel_requested=False, **fields)


def badge_colours(html: str) -> list[tuple[str, str, str]]:
    """(class, background, text colour) of each badge in ``html``."""
    return re.findall(r'class="jobguard-badge ([\w-]+)"[^>]*style="background:(#\w+);color:(#\w+);', html)


@pytest.mark.django_db
def test_every_state_badge_reads_at_aa_and_has_a_colour_of_its_own():
    model_admin = job_admin.JobAdmin(Job, admin.site)
    seen = {}
    for state, _label in job_admin.STATES:
        html = model_admin.state_badge(job_in(state))
        found = badge_colours(html)
        assert len(found) == 1, html
        [(css, background, text)] = found
        assert css == f"state-{state}"
        assert contrast(background, text) >= AA, (state, background, text, contrast(background, text))
        seen[state] = background
    assert len(set(seen.values())) == len(seen), seen
    # Apart enough to tell at a glance, not two shades of one colour (a distance in RGB).
    for (a, ca), (b, cb) in itertools.combinations(seen.items(), 2):
        rgb_a = [int(ca[i : i + 2], 16) for i in (1, 3, 5)]
        rgb_b = [int(cb[i : i + 2], 16) for i in (1, 3, 5)]
        assert sum((x - y) ** 2 for x, y in zip(rgb_a, rgb_b, strict=True)) ** 0.5 >= 40, (a, ca, b, cb)


@pytest.mark.django_db
def test_the_cancel_requested_badge_reads_at_aa_whatever_the_theme():
    job = job_in(JobStatus.RUNNING)
    job.cancel_requested = True
    html = job_admin.JobAdmin(Job, admin.site).state_badge(job)
    badges = {css: (bg, fg) for css, bg, fg in badge_colours(html)}
    background, text = badges["cancel-requested"]  # filled: its contrast does not depend on the page
    assert contrast(background, text) >= AA, (background, text)
    assert background != badges["state-running"][0]


def css_rules(template: str) -> dict[str, dict[str, str]]:
    """Selector -> {property: colour} of the hex colours in a template's <style>."""
    text = (TEMPLATES / template).read_text()
    rules: dict[str, dict[str, str]] = {}
    for selector, body in re.findall(r"([^{}\n]+)\{([^{}]*)\}", text):
        for prop, colour in re.findall(r"(color|background)\s*:\s*(#[0-9a-fA-F]{3,6})\b", body):
            rules.setdefault(selector.strip(), {})[prop] = colour
    return rules


def test_the_timelines_outcome_badges_read_at_aa():
    rules = css_rules("job/change_form.html")
    text = rules[".jobguard-outcome"]["color"]
    tones = {sel: r["background"] for sel, r in rules.items() if sel.startswith(".jobguard-outcome.tone-")}
    assert len(tones) == 4
    for selector, background in tones.items():
        assert contrast(background, text) >= AA, (selector, background)


def test_the_half_open_breaker_state_reads_at_aa_in_both_themes():
    rules = css_rules("flow_control.html")
    assert contrast(rules[".jobguard-flow .half_open"]["color"], WHITE) >= AA
    assert contrast(rules['html[data-theme="dark"] .jobguard-flow .half_open']["color"], DARK) >= AA
