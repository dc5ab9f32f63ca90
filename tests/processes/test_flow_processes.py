"""Flow control across real worker processes: limits hold for the fleet, not per process.

Four (and more, as killed ones are replaced) ``jobguard_worker`` processes claim limited
jobs while the test samples the running rows from the database every few milliseconds and
SIGKILLs a worker every 2 seconds. Runs on SQLite by default (the limited claims take turns
on its write lock) and on PostgreSQL (an advisory lock) or MariaDB (a row lock) with
``JOBGUARD_TEST_DATABASE_URL``.
"""

import datetime
import math
import os
import random
import signal
import time
from collections import Counter

import pytest
from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_jobguard.conf import get_settings
from django_jobguard.models import Breaker, BreakerEvent, DeadLetter, Job
from django_jobguard.registry import registry
from tests.conftest import wait_for
from tests.testapp import tasks_flow
from tests.testapp.models import Execution, Interval

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
    pytest.mark.slow,
]

WORKERS = 4
KILL_EVERY_SECONDS = 2.0
FLOW_ENV = {"JOBGUARD_TEST_FLOW": "1"}


@pytest.fixture
def flow_tasks():
    for task in tasks_flow.ALL:
        registry.register(task)
    yield
    for task in tasks_flow.ALL:
        registry.unregister(task.name)


def running_by_key() -> Counter[str]:
    """Running jobs per limit key, as the database holds them now (one query)."""
    counts: Counter[str] = Counter()
    rows = Job.objects.filter(status="running", queue_name__in=["flow-keyed", "flow-global"]).values_list(
        "queue_name", "flow_keys"
    )
    for queue_name, flow_keys in rows:
        if queue_name == "flow-global":
            counts["three_at_once"] += 1
        for key in flow_keys:
            counts[key] += 1
    return counts


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of the intervals that overlap at one moment."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_concurrency_limits_hold_across_the_fleet_under_a_sigkill_storm(workers, flow_tasks):
    on_server = connection.vendor != "sqlite"  # SQLite's one writer makes its fleet slower
    accounts, per_account, seconds = (6, 40, 0.4) if on_server else (4, 20, 0.8)
    # Two at a time per account, the drain lasts at least per_account * seconds / 2 (8 s):
    # longer than the three kills the test asks for, however fast the host.
    assert per_account * seconds / 2 > 3 * KILL_EVERY_SECONDS
    keyed = [
        tasks_flow.per_account.enqueue(account, seconds)
        for _ in range(per_account)
        for account in range(accounts)
    ]
    unkeyed = [tasks_flow.three_at_once.enqueue(0.2) for _ in range(accounts * per_account // 3)]
    jobs = keyed + unkeyed
    args = ("--queue", "flow-keyed", "--queue", "flow-global", "--concurrency", "4")
    alive = [workers.start(*args, env=FLOW_ENV) for _ in range(WORKERS)]
    limits = {f"c:{tasks_flow.per_account.name}|account:{a}": 2 for a in range(accounts)} | {
        "three_at_once": 3
    }

    samples = over = kills = 0
    most: Counter[str] = Counter()
    deadline = time.monotonic() + 300
    last_kill = time.monotonic()
    pending = len(jobs)
    while pending and time.monotonic() < deadline:
        counts = running_by_key()
        samples += 1
        for key, count in counts.items():
            most[key] = max(most[key], count)
            if count > limits[key]:
                over += 1
        if time.monotonic() - last_kill >= KILL_EVERY_SECONDS:
            victim = random.choice(alive)
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=30)
            alive.remove(victim)
            alive.append(workers.start(*args, env=FLOW_ENV))
            kills += 1
            last_kill = time.monotonic()
        if samples % 50 == 0:
            pending = Job.objects.filter(pk__in=[job.pk for job in jobs]).exclude(status="succeeded").count()
        time.sleep(0.003)  # the sampling period: what is awaited is `pending`, under `deadline`

    print(f"samples={samples} over_limit={over} kills={kills} most_at_once={dict(most)}")
    assert pending == 0, "the jobs did not all succeed in time"
    assert over == 0, f"{over} of {samples} samples had a key over its limit: {dict(most)}"
    assert kills >= 3
    assert samples > 500
    # Every key reached its limit at some point: the limit, not idleness, kept the count down.
    assert all(most[key] == limit for key, limit in limits.items()), dict(most)
    assert not Job.objects.filter(status="dead").exists()
    # The handlers' own records agree: never more than 2 of one account overlapped in time.
    for account in range(accounts):
        rows = Interval.objects.filter(resource=f"account:{account}").values_list("started", "ended")
        assert most_at_once(list(rows)) <= 2


def test_a_rate_holds_across_the_fleet(workers, flow_tasks):
    rate = tasks_flow.rated.rate
    assert rate is not None
    jobs = [tasks_flow.rated.enqueue(n) for n in range(80)]
    for _ in range(WORKERS):
        workers.start("--queue", "flow-rate", "--concurrency", "4", env=FLOW_ENV)
    wait_for(
        lambda: not Job.objects.filter(pk__in=[j.pk for j in jobs]).exclude(status="succeeded").exists(),
        timeout=120,
        message="every rated job to succeed",
    )
    # Claim times on the database clock: GCRA's bound holds for every stretch of them,
    # at most `burst` starts plus one per interval elapsed. started_at is written by the
    # lease statement, after the clock reading the claim decided on: milliseconds later on a
    # quiet host, tens of them on a loaded one (seen: 39 ms, two processes hogging both
    # cores), so a stretch may look up to a fraction of one start fuller. A whole start
    # more would be a start over the rate.
    starts = sorted(
        t.timestamp()
        for t in Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("started_at", flat=True)
    )
    worst = max(
        (j - i + 1) - (starts[j] - starts[i]) / rate.interval
        for i in range(len(starts))
        for j in range(i, len(starts))
    )
    span = starts[-1] - starts[0]
    achieved = (len(starts) - 1) / span
    print(f"starts={len(starts)} span={span:.2f}s achieved={achieved:.1f}/s worst_excess={worst:.2f}")
    assert worst < rate.burst_size + 1


OUTAGE_SECONDS = 6.0


def _at(value) -> float:
    """An attempt's or an event's time (database clock) in seconds since the epoch."""
    moment = parse_datetime(value) if isinstance(value, str) else value
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, datetime.UTC)
    return moment.timestamp()


def test_a_breaker_opens_for_the_fleet_during_an_outage_and_a_probe_closes_it(workers, flow_tasks):
    """A dependency down for OUTAGE_SECONDS, then back: the breaker opens for every worker,
    admits only its probes while it waits, and closes on the first probe that succeeds.
    Every job succeeds exactly once; none is dead-lettered."""
    limit = get_settings().limits["flow-dep"]
    breaker, budget = limit.breaker, limit.retry_budget
    assert breaker is not None and budget is not None
    started = [
        workers.start("--queue", "flow-dep", "--concurrency", "2", env=FLOW_ENV) for _ in range(WORKERS)
    ]
    for proc in started:
        workers.wait_started(proc)
    began = time.time()  # the outage starts once the fleet is up
    Interval.objects.create(
        resource=tasks_flow.OUTAGE, started=began, ended=began + OUTAGE_SECONDS, pid=os.getpid()
    )
    jobs = [tasks_flow.call_dependency.enqueue(n) for n in range(40)]
    ids = [job.pk for job in jobs]
    wait_for(
        lambda: not Job.objects.filter(pk__in=ids).exclude(status="succeeded").exists(),
        timeout=180,
        message="every job to succeed once the dependency is back",
    )

    # No job lost, dead-lettered or run twice: one recorded success per job (atomic with its ack).
    assert not DeadLetter.objects.exists()
    successes = Counter(Execution.objects.filter(marker="dependency-ok").values_list("job_id", flat=True))
    assert sorted(successes) == sorted(ids) and set(successes.values()) == {1}

    events = list(BreakerEvent.objects.filter(name="flow-dep").order_by("created_at", "id"))
    moves = [(e.from_state, e.to_state) for e in events]
    assert moves[0] == ("closed", "open") and moves[-1] == ("half_open", "closed"), moves
    assert Breaker.objects.get(name="flow-dep").state == "closed"

    starts = []  # every counted attempt's claim time, and whether it was a retry
    for history in Job.objects.filter(pk__in=ids).values_list("attempt_history", flat=True):
        starts += [(_at(entry["started_at"]), n > 0) for n, entry in enumerate(history)]
    attempts_while_open, most_per_probe_round = 0, 0
    for event, following in zip(events, [*events[1:], None], strict=True):
        begin, end = _at(event.created_at), _at(following.created_at) if following else float("inf")
        inside = sum(1 for at, _ in starts if begin < at < end)
        if event.to_state == "open":
            attempts_while_open += inside
        elif event.to_state == "half_open":
            most_per_probe_round = max(most_per_probe_round, inside)
    firsts = sum(1 for _, retry in starts if not retry)
    retries = len(starts) - firsts
    span = max(at for at, _ in starts) - min(at for at, _ in starts)
    budget_bound = (math.ceil(span / budget.window) + 1) * budget.min_retries + budget.ratio * firsts
    print(
        f"attempts={len(starts)} first={firsts} retries={retries} (budget bound {budget_bound:.0f}) "
        f"opened={moves.count(('closed', 'open')) + moves.count(('half_open', 'open'))} "
        f"attempts_while_open={attempts_while_open} most_per_probe_round={most_per_probe_round} "
        f"span={span:.1f}s"
    )
    assert attempts_while_open == 0
    assert most_per_probe_round <= breaker.probes
    assert retries <= budget_bound
    assert firsts == len(jobs)
