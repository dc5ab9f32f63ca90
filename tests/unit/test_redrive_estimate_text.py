"""The bulk replay page's estimate reads in the right number: "1 second", "the 1 approved replay"."""

from django_jobguard.admin.dead_letters import _ahead, _duration


def test_redrive_estimates_read_in_the_right_number():
    assert _duration(1) == "1 second" and _duration(45) == "45 seconds"
    assert _duration(60 * 1.2) == "72 seconds" and _duration(61 * 60) == "61 minutes"
    assert _duration(100) == "2 minutes" and _duration(90 * 60) == "1.5 hours"
    assert _ahead(0) == "with no approved replay waiting before"
    assert _ahead(1) == "after the 1 approved replay already waiting"
    assert _ahead(3) == "after the 3 approved replays already waiting"
