"""Admission decides what a limited claim starts from plain values: no database, no store.

Capacity, rate tolerance (GCRA), keys that fill up within a claim, breakers (open,
half-open probes, new probe rounds), retry budgets, and what the caller is told.
"""

import json
from collections import Counter

import pytest

from django_jobguard.flow import (
    BreakerSpec,
    Limit,
    NamedLimit,
    Rate,
    RetryBudgetSpec,
    TaskLimits,
    Throttle,
    build_plan,
)
from django_jobguard.flow.admission import (
    EPSILON,
    Admission,
    count_running,
    count_waiting,
    next_start,
    note_throttle,
    read_gates,
)

NOW = 1_000_000.0
#: A breaker that lets 2 probes through and stays open 30 s; a budget of 1 retry per 2 firsts.
BREAKER = BreakerSpec(open_for=30.0, probes=2)
BUDGET = RetryBudgetSpec(ratio=0.5, min_retries=1, window=60.0)


def plan_of(*tasks, queues=None, limits=()):
    plan = build_plan(queues or {}, {limit.name: limit for limit in limits}, tasks)
    assert plan is not None
    return plan


def admission(plan, running=(), arrivals=None, gates=None, batch_size=10):
    return Admission(plan, Counter(running), NOW, dict(arrivals or {}), gates or {}, batch_size)


def rows(*jobs):
    """``(id, task, queue, flow_keys, attempts)`` candidate rows, flow keys as the database sends them."""
    return [(job_id, task, queue, json.dumps(keys), attempts) for job_id, task, queue, keys, attempts in jobs]


def breaker_row(state="closed", open_until=None, manual=False, probes=0, since=None, budget=(0.0, 0, 0)):
    return ("dep", state, open_until, manual, probes, since, *budget)


# -- concurrency ----------------------------------------------------------------------------


def test_a_task_at_its_concurrency_admits_nothing_and_is_left_out_of_the_read():
    plan = plan_of(TaskLimits("t", "q", concurrency=Limit(2)))
    full = admission(plan, running={"task:t": 2})
    assert full.blocked == {"task:t"}
    assert full.blocked_tasks() == ["t"]
    assert full.admit(rows((1, "t", "q", [], 0))) == []
    assert full.admitted == []


def test_a_task_with_room_for_one_admits_one_and_reports_the_key_that_filled():
    plan = plan_of(TaskLimits("t", "q", concurrency=Limit(2)))
    claim = admission(plan, running={"task:t": 1})
    assert claim.blocked == set()
    filled = claim.admit(rows((1, "t", "q", [], 0), (2, "t", "q", [], 0), (3, "t", "q", [], 0)))
    assert claim.admitted == [1]
    assert filled == ["task:t"]  # once, though two rows were held back by it
    assert claim.blocked_tasks() == ["t"]
    assert claim.running["task:t"] == 2


def test_a_full_key_holds_back_its_own_jobs_only():
    plan = plan_of(TaskLimits("t", "q", concurrency=Limit(1, key="account:{account_id}")))
    claim = admission(plan)
    filled = claim.admit(
        rows(
            (1, "t", "q", ["c:t|account:1"], 0),
            (2, "t", "q", ["c:t|account:1"], 0),
            (3, "t", "q", ["c:t|account:2"], 0),
            (4, "t", "q", ["c:t|account:1"], 0),
        )
    )
    assert claim.admitted == [1, 3]
    assert filled == ["c:t|account:1"]
    assert claim.blocked_keys() == ["c:t|account:1"]  # account:2 is full too, but hid no row
    assert claim.full("c:t|account:2")
    assert claim.blocked_tasks() == []  # the task is not blocked: other accounts' jobs may start


def test_a_queue_at_its_concurrency_is_blocked_for_every_task():
    plan = plan_of(TaskLimits("t", "other"), queues={"exports": 2})
    claim = admission(plan, running={"queue:exports": 1})
    claim.admit(rows((1, "x", "exports", [], 0), (2, "y", "exports", [], 0)))
    assert claim.admitted == [1]
    assert claim.blocked_queues() == {"exports"}


def test_a_claim_stops_at_its_limit_and_passes_over_rows_it_saw_before():
    plan = plan_of(TaskLimits("t", "q", concurrency=Limit(10)))
    claim = admission(plan, batch_size=2)
    claim.admit(rows((1, "t", "q", [], 0)))
    assert not claim.done
    claim.admit(rows((1, "t", "q", [], 0), (2, "t", "q", [], 0), (3, "t", "q", [], 0)))
    assert claim.admitted == [1, 2]
    assert claim.done
    assert claim.running["task:t"] == 2


def test_a_job_whose_stored_keys_cannot_be_read_is_admitted_under_none_of_them_and_marked():
    plan = plan_of(TaskLimits("t", "q", concurrency=Limit(1, key="k:{k}")))
    claim = admission(plan, running={"c:t|k:1": 1})
    unreadable = (7, "t", "q", '{"c": "t|k:1"}', 0)
    claim.admit([unreadable, *rows((8, "t", "q", ["c:t|k:1"], 0))])
    assert claim.admitted == [7]
    assert claim.unreadable == {7: '{"c": "t|k:1"}'}


# -- rates ----------------------------------------------------------------------------------


def test_a_rate_admits_its_burst_at_once_then_holds_back_until_the_next_interval():
    plan = plan_of(TaskLimits("t", "q", rate=Rate("1/s", burst=3)))
    claim = admission(plan)
    filled = claim.admit(rows(*[(n, "t", "q", [], 0) for n in range(1, 6)]))
    assert claim.admitted == [1, 2, 3]
    assert filled == ["rate:task:t"]
    assert claim.advanced == {"rate:task:t": NOW + 3.0}
    # Three starts ran the arrival time 3 s ahead; the burst tolerates 2 s: one more in 1 s.
    assert next_start(plan, claim.arrivals, NOW) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("ahead", "full"), [(0.0, False), (2.0, False), (2.0 + 2 * EPSILON, True), (5.0, True)]
)
def test_a_rate_key_is_full_once_its_arrival_time_runs_past_the_bursts_tolerance(ahead, full):
    plan = plan_of(TaskLimits("t", "q", rate=Rate("1/s", burst=3)))  # tolerance: 2 s
    claim = admission(plan, arrivals={"rate:task:t": NOW + ahead})
    assert claim.full("rate:task:t") is full
    assert (claim.blocked == {"rate:task:t"}) is full


def test_an_arrival_time_in_the_past_counts_from_now():
    plan = plan_of(TaskLimits("t", "q", rate=Rate("1/s")))
    claim = admission(plan, arrivals={"rate:task:t": NOW - 100.0})
    claim.admit(rows((1, "t", "q", [], 0), (2, "t", "q", [], 0)))
    assert claim.admitted == [1]
    assert claim.advanced == {"rate:task:t": NOW + 1.0}


def test_the_caller_is_told_what_held_jobs_back_and_when_a_rate_admits_again():
    plan = plan_of(
        TaskLimits("rated", "q", rate=Rate("2/s")),  # burst 2, tolerance 0.5 s
        TaskLimits("capped", "q", concurrency=Limit(1)),
    )
    throttle = Throttle()
    arrivals = {"rate:task:rated": NOW + 1.25}
    note_throttle(throttle, plan, {"task:capped", "rate:task:rated"}, {}, NOW, arrivals)
    assert throttle.held_back == {"concurrency", "rate"}
    assert throttle.retry_after == pytest.approx(0.75)
    throttle = Throttle()
    note_throttle(throttle, plan, {"task:capped"}, {}, NOW, {})
    assert throttle.held_back == {"concurrency"}
    assert throttle.retry_after is None  # a full concurrency key frees only when a job ends


# -- breakers and retry budgets -------------------------------------------------------------


def guarded_plan(breaker=BREAKER, budget=None):
    return plan_of(
        TaskLimits("call", "q", limit="dep"),
        limits=[NamedLimit("dep", concurrency=None, rate=None, breaker=breaker, retry_budget=budget)],
    )


def test_an_open_breaker_blocks_its_tasks_until_its_open_time_is_up():
    plan = guarded_plan()
    gates = read_gates(plan, [breaker_row("open", open_until=NOW + 12.0)], NOW)
    assert gates["dep"].closed_to_all
    assert not gates["dep"].half_opened
    claim = admission(plan, gates=gates)
    assert claim.blocked_tasks() == ["call"]
    assert claim.admit(rows((1, "call", "q", [], 0))) == []
    assert claim.admitted == []
    throttle = Throttle()
    note_throttle(throttle, plan, claim.blocked, gates, NOW, {})
    assert throttle.held_back == {"breaker"}
    assert throttle.breaker_states == {"dep": "open"}
    assert throttle.retry_after == pytest.approx(12.0)


def test_an_open_breaker_whose_time_is_up_half_opens_and_admits_its_probes_only():
    plan = guarded_plan()
    gates = read_gates(plan, [breaker_row("open", open_until=NOW - 1.0, probes=7)], NOW)
    gate = gates["dep"]
    assert (gate.state, gate.half_opened, gate.probe_room) == ("half_open", True, 2)
    claim = admission(plan, gates=gates)
    claim.admit(rows(*[(n, "call", "q", [], 0) for n in range(1, 5)]))
    assert claim.admitted == [1, 2]
    assert (gate.probes_taken, gate.probe_room, gate.closed_to_all) == (2, 0, True)


def test_a_breaker_held_open_by_hand_stays_open_past_its_time():
    gates = read_gates(guarded_plan(), [breaker_row("open", open_until=NOW - 1.0, manual=True)], NOW)
    assert gates["dep"].state == "open"
    assert not gates["dep"].half_opened
    assert gates["dep"].closed_to_all


def test_half_open_probes_that_all_went_out_long_ago_start_a_new_round():
    stale = read_gates(guarded_plan(), [breaker_row("half_open", probes=2, since=NOW - 30.0)], NOW)
    assert (stale["dep"].new_round, stale["dep"].probe_room) == (True, 2)
    recent = read_gates(guarded_plan(), [breaker_row("half_open", probes=2, since=NOW - 29.0)], NOW)
    assert (recent["dep"].new_round, recent["dep"].probe_room) == (False, 0)
    assert recent["dep"].closed_to_all
    assert recent["dep"].wait(NOW) == 30.0  # the probes' verdict, or a new round, by then


def test_a_limit_with_no_breaker_row_yet_is_closed_and_admits():
    plan = guarded_plan(budget=BUDGET)
    gates = read_gates(plan, [], NOW)
    assert gates["dep"].state == "closed"
    assert gates["dep"].budget_start == NOW  # its budget's window starts with this claim
    claim = admission(plan, gates=gates)
    claim.admit(rows((1, "call", "q", [], 0), (2, "call", "q", [], 1)))
    assert claim.admitted == [1, 2]
    assert (gates["dep"].first_attempts, gates["dep"].retries, gates["dep"].budget_moved) == (1, 1, True)


def test_a_spent_retry_budget_holds_back_retries_but_never_first_attempts():
    plan = guarded_plan(breaker=None, budget=BUDGET)
    # Two first attempts allow max(1, 0.5 * 2) = 1 retry, and it was taken 10 s ago.
    gates = read_gates(plan, [breaker_row(budget=(NOW - 10.0, 2, 1))], NOW)
    assert gates["dep"].retries_spent
    claim = admission(plan, gates=gates)
    assert claim.blocked_tasks() == []
    assert claim.blocked_retries([]) == ["call"]
    claim.admit(rows((1, "call", "q", [], 3), (2, "call", "q", [], 0), (3, "call", "q", [], 0)))
    assert claim.admitted == [2, 3]
    # Four first attempts now allow two retries: one is left.
    assert gates["dep"].admits(1)
    throttle = Throttle()
    spent = read_gates(plan, [breaker_row(budget=(NOW - 10.0, 2, 1))], NOW)
    note_throttle(throttle, plan, set(), spent, NOW, {})
    assert throttle.held_back == {"budget"}
    assert throttle.retry_after == pytest.approx(50.0)  # the window's end


def test_a_retry_budget_counts_afresh_once_its_window_is_over():
    plan = guarded_plan(breaker=None, budget=BUDGET)
    gates = read_gates(plan, [breaker_row(budget=(NOW - 60.0, 2, 1))], NOW)
    assert (gates["dep"].budget_start, gates["dep"].retries) == (NOW, 0)
    assert not gates["dep"].retries_spent


# -- counting -------------------------------------------------------------------------------


def test_running_jobs_count_under_their_concurrency_keys_only():
    plan = plan_of(
        TaskLimits("t", "q", concurrency=Limit(1, key="k:{k}"), rate=Rate("1/s")),
        queues={"q": 5},
    )
    running = count_running(
        plan, [("t", "q", '["c:t|k:1", "r:t|x"]'), ("t", "q", "not json"), ("other", "q", None)]
    )
    assert running == Counter({"queue:q": 3, "c:t|k:1": 1})


def test_waiting_jobs_count_under_every_key_they_wait_for():
    plan = plan_of(TaskLimits("t", "q", rate=Rate("1/s")))
    waiting = count_waiting(plan, [("t", "q", '["r:t|a"]', 4), ("t", "q", "[]", 2)])
    assert waiting == Counter({"rate:task:t": 6, "r:t|a": 4})
