"""T12: metrics under faults: queue gauges equal the database, counters never go back.

Written against issue 6's public API: the scrape-time collector
``django_jobguard.monitoring.metrics.QueueCollector`` (``jobguard_queue_*`` gauges) and
prometheus_client's multiprocess mode for the workers' counters (``PROMETHEUS_MULTIPROC_DIR``),
which keeps a killed worker's counts. Skipped, naming the missing piece, until they exist.

Workers are SIGKILLed and respawned (as in T1) and their connections terminated (as in
T3) while the test samples the counters aggregated over every worker process: no counter
may ever read lower than before. With every worker paused (the queue frozen), and again
at the end, each gauge must equal the count the database gives.
"""

import collections
import time

import pytest
from django.db.models import Count

from django_jobguard.models import DeadLetter, Job
from django_jobguard.monitoring import metrics

from .harness import Pool, django_backend_pid, enqueue_probes, open_jobs, run_until

pytestmark = [pytest.mark.reliability, pytest.mark.postgres, pytest.mark.processes, pytest.mark.slow]

MISSING = [name for name in ("QueueCollector",) if not hasattr(metrics, name)]
GAUGES = {
    "jobguard_queue_depth": lambda q: Job.objects.due().filter(queue_name=q).count(),
    "jobguard_queue_scheduled": lambda q: Job.objects.scheduled().filter(queue_name=q).count(),
    # Running with a live lease: a killed worker's job whose lease ran out while the workers are
    # paused (no reaper runs) is stuck, not in flight, in the gauge as on the job list.
    "jobguard_queue_in_flight": lambda q: Job.objects.leased().filter(queue_name=q).count(),
    "jobguard_queue_dead_letters": lambda q: DeadLetter.objects.filter(queue_name=q).count(),
}


def counters(directory):
    """Every counter summed over all worker processes, dead ones included."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    # The view's collector: a worker killed as it created a file leaves that file empty.
    metrics.multiprocess_collector(registry, path=str(directory))
    totals = collections.Counter()
    for family in registry.collect():
        if family.type == "counter":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    totals[sample.name] += sample.value
    return totals


def gauges(queue):
    values = {}
    for family in metrics.QueueCollector().collect():
        for sample in family.samples:
            if sample.name in GAUGES and sample.labels.get("queue") == queue:
                values[sample.name] = int(sample.value)
    return values


def expected_gauges(queue):
    return {name: count(queue) for name, count in GAUGES.items()}


def scrape_and_count(queue, attempts=20):
    """A scrape and the database's counts for the same moment.

    Paused workers stop claiming, but time goes on: a retry's backoff can run out between the
    scrape and the count, moving a job from scheduled to due. The scrape is taken between two
    counts and kept only when the counts agree, so a difference left is the collector's own.
    """
    for _ in range(attempts):
        before = expected_gauges(queue)
        scraped = gauges(queue)
        if expected_gauges(queue) == before:
            return scraped, before
        time.sleep(0.05)
    raise AssertionError(f"the database counts for {queue} changed across {attempts} scrapes")


@pytest.mark.scenario("T12")
@pytest.mark.skipif(
    bool(MISSING), reason=f"needs issue 6: django_jobguard.monitoring.metrics.{', '.join(MISSING)}"
)
def test_t12_gauges_equal_the_database_and_counters_never_decrease_under_faults(
    scenario, observer, workers, tmp_path
):
    from tests.testapp import tasks_faults

    rng = scenario.rng
    queue = tasks_faults.QUEUE
    total = scenario.size(400)
    directory = tmp_path / "prometheus"
    directory.mkdir()
    scenario.parameters = {"jobs": total, "workers": 3, "kill_interval_seconds": [1, 2], "terminations": 4}
    calls = [
        ((), {"marker": f"t12-{i}", "seconds": 0.05, **({"fail": "always"} if i % 50 == 0 else {})})
        for i in range(total)
    ]
    enqueue_probes(scenario.history, calls)
    pool = Pool(
        workers,
        scenario.history,
        observer,
        size=3,
        concurrency=2,
        env={"PROMETHEUS_MULTIPROC_DIR": str(directory)},
    ).start()
    samples, decreases = [], []
    django_pid = django_backend_pid()
    state = {"kill": time.monotonic() + 1, "terminate": time.monotonic() + 2, "terminations": 0}

    def tick():
        pool.reap_exits()
        now = time.monotonic()
        if now >= state["kill"] and pool.live():
            pool.kill(rng.choice(pool.live()))
            state["kill"] = now + rng.uniform(1, 2)
        if now >= state["terminate"] and state["terminations"] < 4:
            observer.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND pid <> %s AND backend_type = 'client backend'",
                [django_pid],
            )
            state["terminations"] += 1
            state["terminate"] = now + rng.uniform(1, 3)
        current = counters(directory)
        if samples:
            for name, value in samples[-1].items():
                if current.get(name, 0) < value:
                    decreases.append((name, value, current.get(name, 0)))
        samples.append(current)

    run_until(lambda: open_jobs(observer) <= total // 2, timeout=300, tick=tick)
    for slot in pool.live():
        pool.pause(slot)
    frozen = scrape_and_count(queue)
    for slot in pool.slots:
        if slot.paused:
            pool.resume(slot)
    drained = run_until(lambda: open_jobs(observer) == 0, timeout=300, tick=tick)
    pool.stop()
    final = scrape_and_count(queue)
    last = counters(directory)
    statuses = dict(Job.objects.values_list("status").annotate(n=Count("id")))
    scenario.finish(
        drained=drained,
        samples=len(samples),
        counter_decreases=len(decreases),
        gauges_while_frozen={"scraped": frozen[0], "database": frozen[1]},
        gauges_at_end={"scraped": final[0], "database": final[1]},
        succeeded_counter=last.get("jobguard_jobs_succeeded_total", 0),
        statuses=statuses,
        worker_deaths=len(pool.deaths),
    )

    assert drained
    assert decreases == [], decreases[:5]
    assert frozen[0] == frozen[1], frozen
    assert final[0] == final[1], final
    # No ack is counted twice; one whose worker was killed between commit and count is missed.
    assert 0 < last.get("jobguard_jobs_succeeded_total", 0) <= statuses.get("succeeded", 0)
