"""Circuit breakers and retry budgets: what the limited claim admits.

Breakers are Breaker rows that breakers.py writes and the database stores' limited claims read;
the in-memory store keeps none (docs/reference/memory-store.md), so these run on the database only.

Runs on SQLite by default and on PostgreSQL or MariaDB with ``JOBGUARD_TEST_DATABASE_URL``. The
dependency is ``JOBGUARD["LIMITS"]["flow-dep"]`` of tests/settings.py (breaker: 50% of at
least 6 calls in 10 s, open 1.5 s, 2 probes; budget: 50% of first attempts, at least 4 per
3 s). The fleet-wide proof with worker processes is tests/processes/test_flow_processes.py.
"""

import logging

import pytest
from django.contrib.auth.models import Permission, User

from django_jobguard import breakers, events, store
from django_jobguard.conf import get_settings
from django_jobguard.exceptions import BreakerError, BreakerPermissionDenied
from django_jobguard.flow import Throttle
from django_jobguard.models import Breaker, BreakerEvent, Job
from django_jobguard.monitoring.stats import breaker_stats
from django_jobguard.registry import registry
from tests.support.factories import make_user
from tests.testapp import tasks_flow

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("claims_start_from_the_head"),
]

DEP = "flow-dep"


def spec():
    breaker = get_settings().limits[DEP].breaker
    assert breaker is not None
    return breaker


def claim(batch_size=10, throttle=None):
    return store.claim(
        "default", ["flow-dep"], batch_size, "test-worker", flow=registry.flow_plan(), throttle=throttle
    )


def calls(n, *, failed):
    for _ in range(n):
        breakers.record("default", DEP, spec(), failed=failed)


def state():
    row = Breaker.objects.filter(name=DEP).first()
    return row.state if row is not None else "closed"


def transitions():
    return [
        (e.from_state, e.to_state, e.actor_name) for e in BreakerEvent.objects.order_by("created_at", "id")
    ]


def time_up():
    """The open time is over (as if ``open_for`` had passed on the database clock)."""
    Breaker.objects.filter(name=DEP).update(open_until=0)


def test_failures_past_the_threshold_open_the_breaker_and_its_jobs_wait_without_an_attempt(flow_tasks):
    jobs = [tasks_flow.call_dependency.enqueue(n) for n in range(5)]
    calls(5, failed=True)
    assert state() == "closed"  # 5 calls: fewer than min_calls (6)
    calls(1, failed=True)
    assert state() == "open"
    assert transitions() == [("closed", "open", "system")]
    assert "6 of 6 calls failed" in Breaker.objects.get(name=DEP).reason
    throttle = Throttle()
    assert claim(throttle=throttle) == []
    assert throttle.held_back == {"breaker"}
    assert throttle.retry_after is not None and 0 < throttle.retry_after <= spec().open_for
    assert (
        sorted(Job.objects.filter(pk__in=[j.id for j in jobs]).values_list("status", "attempts"))
        == [("queued", 0)] * 5
    )


def test_a_failure_rate_under_the_threshold_keeps_it_closed(flow_tasks):
    calls(4, failed=False)
    calls(3, failed=True)  # 3 of 7: under 50%
    assert state() == "closed"
    calls(1, failed=True)  # 4 of 8: at 50%
    assert state() == "open"


def test_after_its_open_time_the_claim_admits_the_probes_only_and_a_success_closes_it(flow_tasks):
    jobs = [tasks_flow.call_dependency.enqueue(n) for n in range(6)]
    calls(6, failed=True)
    time_up()
    throttle = Throttle()
    probes = claim(throttle=throttle)
    assert [job.id for job in probes] == [job.id for job in jobs[:2]]  # probes = 2
    assert throttle.breaker_changes == [(DEP, "open", "half_open")]
    assert state() == "half_open"
    assert claim() == []  # both probes are out: nothing more until one answers
    calls(1, failed=False)
    assert state() == "closed"
    assert len(claim()) == 4
    assert [t[:2] for t in transitions()] == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]


def test_probes_taken_by_later_claims_of_a_round_count_toward_it(flow_tasks, settings):
    # A breaker without a retry budget: the budget's own write used to carry the probes' count.
    limits = dict(settings.JOBGUARD["LIMITS"])
    limits[DEP] = {key: value for key, value in limits[DEP].items() if key != "retry_budget"}
    settings.JOBGUARD = {**settings.JOBGUARD, "LIMITS": limits}
    [tasks_flow.call_dependency.enqueue(n) for n in range(4)]
    calls(6, failed=True)
    time_up()
    assert len(claim(batch_size=1)) == 1  # half-opens it: the round's first probe
    assert len(claim(batch_size=1)) == 1  # its second, by a claim of the half-open breaker
    assert claim() == []  # both probes are out
    assert Breaker.objects.get(name=DEP).probes == 2


def test_a_failed_probe_opens_it_again(flow_tasks):
    [tasks_flow.call_dependency.enqueue(n) for n in range(4)]
    calls(6, failed=True)
    time_up()
    assert len(claim()) == 2
    calls(1, failed=True)
    assert state() == "open"
    assert claim() == []
    row = Breaker.objects.get(name=DEP)
    assert row.open_until is not None and row.probes == 0


def test_other_limited_tasks_are_claimed_while_a_breaker_is_open(flow_tasks):
    tasks_flow.call_dependency.enqueue(1)
    other = tasks_flow.shared_a.enqueue(1)
    calls(6, failed=True)
    claimed = store.claim("default", None, 10, "w", flow=registry.flow_plan())
    assert [job.id for job in claimed] == [other.id]


def test_an_operator_opens_and_closes_it_by_hand_and_each_change_is_in_the_trail(flow_tasks):
    job = tasks_flow.call_dependency.enqueue(1)
    with pytest.raises(BreakerError, match="reason is required"):
        breakers.open_breaker(DEP, actor="ops", reason="")
    change = breakers.open_breaker(DEP, actor="ops", reason="provider maintenance")
    assert change.changed and change.state == "open"
    assert not breakers.open_breaker(DEP, actor="ops", reason="again").changed
    time_up()
    calls(3, failed=False)  # held by hand: neither its time nor successes close it
    assert state() == "open"
    assert claim() == []
    breakers.close(DEP, actor="ops", reason="maintenance over")
    assert [job.id for job in claim()] == [job.id]
    assert transitions() == [("closed", "open", "ops"), ("open", "closed", "ops")]
    assert BreakerEvent.objects.filter(reason="provider maintenance").exists()


def test_only_a_declared_breaker_may_be_operated_and_only_with_the_permission(flow_tasks):
    with pytest.raises(BreakerError, match="No breaker is named 'flow-shared'"):
        breakers.open_breaker("flow-shared", actor="ops", reason="x")
    user = make_user("viewer", staff=False)
    with pytest.raises(BreakerPermissionDenied):
        breakers.open_breaker(DEP, user=user, reason="x")
    user.user_permissions.add(Permission.objects.get(codename="operate_breaker"))
    user = User.objects.get(pk=user.pk)
    assert breakers.open_breaker(DEP, user=user, reason="x").changed_by == "viewer"


def test_the_retry_budget_holds_retries_back_but_never_first_attempts(flow_tasks):
    retries = [tasks_flow.call_dependency.enqueue(n) for n in range(10)]
    Job.objects.filter(pk__in=[j.id for j in retries]).update(attempts=1)  # each failed once before
    firsts = [tasks_flow.call_dependency.enqueue(n) for n in range(10, 12)]
    throttle = Throttle()
    claimed = {job.id for job in claim(batch_size=50, throttle=throttle)}
    # 2 first attempts; retries allowed: max(min_retries 4, 50% of 2) = 4.
    assert {j.id for j in firsts} <= claimed
    assert len(claimed & {j.id for j in retries}) == 4
    assert claim(batch_size=50) == []
    waiting = Job.objects.filter(status="queued")
    assert waiting.count() == 6 and set(waiting.values_list("attempts", flat=True)) == {1}
    more = [tasks_flow.call_dependency.enqueue(n) for n in range(20, 30)]
    # A claim that finds the budget spent reads no retries; the first attempts it starts
    # widen the budget for the next claim: 12 first attempts allow 6 retries, 4 are spent.
    assert {job.id for job in claim(batch_size=50, throttle=throttle)} == {j.id for j in more}
    assert len(claim(batch_size=50)) == 2
    assert claim(batch_size=50) == []
    row = Breaker.objects.get(name=DEP)
    assert (row.first_attempts, row.retries) == (12, 6)


def test_the_report_shows_the_breaker_its_counts_and_its_waiting_jobs(flow_tasks):
    [tasks_flow.call_dependency.enqueue(n) for n in range(3)]
    calls(6, failed=True)
    (stats,) = breaker_stats()
    assert (stats.limit, stats.state, stats.state_value) == (DEP, "open", 2)
    assert (stats.calls, stats.failures, stats.waiting) == (6, 6, 3)
    assert stats.opens_in is not None and 0 < stats.opens_in <= spec().open_for
    assert stats.budget_remaining == 4


def test_no_breaker_no_report():
    assert breaker_stats() == []


def test_each_change_is_an_event_a_log_line_and_a_counted_transition(flow_tasks, caplog):
    caplog.set_level(logging.INFO, logger="django_jobguard.breakers")
    seen = []
    events.add_sink(seen.append)
    try:
        calls(6, failed=True)
        time_up()
        throttle = Throttle()
        tasks_flow.call_dependency.enqueue(1)
        claim(throttle=throttle)  # half-opens: the worker reports it (Worker._report_throttle)
        calls(1, failed=False)
    finally:
        events.remove_sink(seen.append)
    changes = [(e.limit, e.from_state, e.to_state) for e in seen if isinstance(e, events.BreakerChanged)]
    assert changes == [(DEP, "closed", "open"), (DEP, "half_open", "closed")]
    assert throttle.breaker_changes == [(DEP, "open", "half_open")]
    logged = [r.getMessage().split()[0] for r in caplog.records if r.name == "django_jobguard.breakers"]
    assert logged == ["breaker_open", "breaker_closed"]


def test_a_breaker_no_task_names_leaves_every_claim_the_plain_claim():
    # tests/settings.py declares flow-dep's breaker; with its task unregistered nothing is limited.
    assert get_settings().limits[DEP].breaker is not None
    assert registry.flow_plan() is None


def test_a_worker_gathers_the_successes_of_a_closed_breaker_and_counts_each_failure_at_once():
    from types import SimpleNamespace

    from django_jobguard.worker.completer import Completer

    completer = Completer("default", "w")
    completer.breakers = {tasks_flow.call_dependency.name: (DEP, spec())}
    job = SimpleNamespace(id=1, task_name=tasks_flow.call_dependency.name)
    for _ in range(3):
        completer._call(job, failed=False)
    assert not Breaker.objects.filter(name=DEP).exists()  # held: no transaction per success
    completer._call(job, failed=True)
    row = Breaker.objects.get(name=DEP)
    assert (row.calls, row.failures) == (4, 1)
    # A breaker this worker last saw half-open: a probe's answer is counted at once.
    completer.breaker_states = {DEP: "half_open"}
    completer._call(job, failed=False)
    assert Breaker.objects.get(name=DEP).calls == 5
