"""The paused-queue alert of the operator's console: on the real gauge, after half an hour."""

from tests.unit.test_metrics import alert_rules


def test_a_queue_paused_for_half_an_hour_raises_an_alert_linking_its_runbook():
    rule = next(rule for rule in alert_rules() if rule["alert"] == "JobguardQueuePaused")
    assert "jobguard_queue_paused" in rule["expr"] and "== 1" in rule["expr"]
    assert rule["for"] == "30m"
    assert rule["annotations"]["runbook_url"] == "docs/runbooks/paused-queue.md"
