"""The paused-queue alert of the operator's console: on the real gauge, after half an hour."""

from tests.support.prometheus import alert_rules


def test_a_queue_paused_for_half_an_hour_raises_an_alert_linking_its_runbook():
    rule = next(rule for rule in alert_rules() if rule["alert"] == "JobguardQueuePaused")
    assert "jobguard_queue_paused" in rule["expr"] and "== 1" in rule["expr"]
    assert rule["for"] == "30m"
    assert rule["annotations"]["runbook_url"] == "docs/runbooks/paused-queue.md"


def test_a_breaker_open_for_ten_minutes_and_a_spent_budget_raise_alerts_linking_their_runbooks():
    rules = {rule["alert"]: rule for rule in alert_rules()}
    opened = rules["JobguardBreakerOpen"]
    assert "jobguard_breaker_state" in opened["expr"] and "== 2" in opened["expr"]
    assert opened["for"] == "10m"
    assert opened["annotations"]["runbook_url"] == "docs/runbooks/open-breaker.md"
    spent = rules["JobguardRetryBudgetSpent"]
    assert "jobguard_retry_budget_remaining" in spent["expr"] and "jobguard_breaker_waiting" in spent["expr"]
    assert spent["annotations"]["runbook_url"] == "docs/runbooks/spent-retry-budget.md"
