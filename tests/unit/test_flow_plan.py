"""The flow plan is built from plain values (no task object, no settings read, no database)."""

from django_jobguard.flow import (
    BreakerGate,
    BreakerSpec,
    Limit,
    NamedLimit,
    Rate,
    RateSpec,
    RetryBudgetSpec,
    TaskLimits,
    build_plan,
    family,
)

STRIPE = NamedLimit(
    "stripe", concurrency=4, rate=Rate("10/s", burst=5), breaker=BreakerSpec(), retry_budget=RetryBudgetSpec()
)
MAIL = NamedLimit("mail", concurrency=None, rate=Rate("2/s"))


def test_nothing_declared_is_no_plan_so_every_claim_stays_plain():
    assert build_plan({}, {"stripe": STRIPE}, []) is None


def test_each_declaration_becomes_its_keys_with_their_bounds():
    plan = build_plan(
        {"exports": 3},
        {"stripe": STRIPE, "mail": MAIL},
        [
            TaskLimits("charge", "payments", concurrency=Limit(2), rate=Rate("1/s"), limit="stripe"),
            TaskLimits("sync", "default", concurrency=Limit(1, key="account:{account_id}")),
            TaskLimits("notify", "mail", rate=Rate("5/m", key="user:{user_id}", burst=2), limit="mail"),
        ],
    )
    assert plan is not None
    assert plan.capacities == {"queue:exports": 3, "task:charge": 2, "limit:stripe": 4}
    assert plan.rates == {
        "rate:task:charge": RateSpec(1.0, 1),
        "rate:limit:stripe": RateSpec(0.1, 5),
        "rate:limit:mail": RateSpec(0.5, 2),  # a burst of one second's worth
    }
    assert plan.task_keys == {
        "charge": ("task:charge", "rate:task:charge", "limit:stripe", "rate:limit:stripe"),
        "sync": (),
        "notify": ("rate:limit:mail",),
    }
    assert plan.keyed_capacity == {"sync": 1}
    assert plan.keyed_rates == {"notify": RateSpec(12.0, 2)}
    assert plan.templates == {"c:sync": "account:{account_id}", "r:notify": "user:{user_id}"}
    assert plan.guards == {"stripe": BreakerGate(BreakerSpec(), RetryBudgetSpec())}
    assert plan.guarded_tasks == {"charge": "stripe"}
    assert plan.queues == frozenset({"exports", "payments", "default", "mail"})
    assert plan.most_per_key == 2  # the keyed rate's burst, above the keyed concurrency's 1


def test_a_job_counts_under_its_tasks_keys_its_stored_keys_and_its_queues():
    plan = build_plan({"exports": 3}, {}, [TaskLimits("charge", "exports", concurrency=Limit(2))])
    assert plan is not None
    assert plan.keys_of("charge", "exports", ["c:charge|a"]) == ["task:charge", "c:charge|a", "queue:exports"]
    assert plan.keys_of("other", "default", []) == []
    assert plan.capacity("queue:exports") == 3
    assert plan.capacity("c:gone|a") is None  # a stored key no limit declares any longer
    assert plan.rate("task:charge") is None


def test_a_task_naming_an_undeclared_shared_limit_keeps_its_own_limits_only():
    plan = build_plan({}, {}, [TaskLimits("charge", "payments", rate=Rate("1/s"), limit="missing")])
    assert plan is not None
    assert plan.task_keys == {"charge": ("rate:task:charge",)}
    assert plan.guards == {}


def test_a_claim_is_limited_only_where_a_limited_job_may_be():
    plan = build_plan({"exports": 3}, {}, [TaskLimits("charge", "payments", concurrency=Limit(2))])
    assert plan is not None
    assert plan.covers(["payments", "default"], [])
    assert not plan.covers(["default"], [])
    assert plan.covers(None, ["exports"])  # every queue but exports: payments is among them
    assert not plan.covers(None, ["exports", "payments"])


def test_a_rates_tolerance_is_its_burst_less_one_interval():
    assert RateSpec.of(Rate("10/s", burst=5)) == RateSpec(0.1, 5)
    assert RateSpec(0.5, 3).tolerance == 1.0
    assert RateSpec(2.0, 1).tolerance == 0.0


def test_a_keyed_key_belongs_to_its_tasks_family_and_an_unkeyed_one_to_itself():
    assert family("c:tasks.sync|account:1|x") == "c:tasks.sync"
    assert family("r:tasks.notify|user:7") == "r:tasks.notify"
    assert family("limit:stripe") == "limit:stripe"
    assert family("queue:exports") == "queue:exports"
