"""A closed breaker's successes are gathered and counted with the next count (no database)."""

from django_jobguard.breakers import HeldSuccesses


def test_successes_of_a_closed_breaker_are_gathered_within_the_hold():
    held = HeldSuccesses(hold_seconds=1.0)
    assert held.take("pay", failed=False, closed=True, now=10.0) is None
    assert held.take("pay", failed=False, closed=True, now=10.5) is None
    # Past the hold, this success is counted with the two gathered before it.
    assert held.take("pay", failed=False, closed=True, now=11.0) == 2
    assert held.take("pay", failed=False, closed=True, now=11.1) is None


def test_a_failure_is_counted_at_once_with_the_successes_gathered_before_it():
    held = HeldSuccesses()
    held.take("pay", failed=False, closed=True, now=0.0)
    held.take("pay", failed=False, closed=True, now=0.1)
    assert held.take("pay", failed=True, closed=True, now=0.2) == 2
    assert held.take("pay", failed=True, closed=True, now=0.3) == 0


def test_any_outcome_while_the_breaker_is_not_closed_is_counted_at_once():
    held = HeldSuccesses()
    assert held.take("pay", failed=False, closed=False, now=0.0) == 0
    assert held.take("pay", failed=False, closed=True, now=0.1) is None
    assert held.take("pay", failed=False, closed=False, now=0.2) == 1


def test_each_limit_gathers_its_own():
    held = HeldSuccesses()
    held.take("pay", failed=False, closed=True, now=0.0)
    held.take("mail", failed=False, closed=True, now=0.0)
    held.take("mail", failed=False, closed=True, now=0.1)
    assert held.take("pay", failed=True, closed=True, now=0.2) == 1
    assert held.take("mail", failed=True, closed=True, now=0.2) == 2
