"""T8: poison jobs mixed into 500 healthy ones.

A job that kills its worker every time, one that hangs past its hard timeout,
undecodable payloads (stored arguments that are not a list / not an object / a bare JSON
string), an unknown task path, a non-JSON return value and ``SystemExit``: each must reach
the dead-letter queue after the right number of attempts with its reason code, every
healthy job must succeed, and no worker may die except by the job that kills it.
"""

import pytest
from django.db import connection

from django_jobguard.models import DeadLetter, Job
from tests.testapp import tasks_faults

from .harness import Pool, check, enqueue_probes, open_jobs, run_until

pytestmark = [pytest.mark.reliability, pytest.mark.postgres, pytest.mark.processes, pytest.mark.slow]

COPIES = 2
#: kind -> (expected reason, expected attempts)
EXPECTED = {
    "kills_worker": ("lease_expired", 2),
    "hangs": ("hard_timeout", 2),
    "args_not_a_list": ("invalid_payload", 1),
    "kwargs_not_an_object": ("invalid_payload", 1),
    "args_a_json_string": ("invalid_payload", 1),
    "unknown_task": ("unknown_task", 1),
    "non_json_result": ("invalid_result", 1),
    "system_exit": ("retries_exhausted", 3),
}


def enqueue_poison(kind):
    if kind == "kills_worker":
        return tasks_faults.poison_kill.enqueue()
    if kind == "hangs":
        return tasks_faults.poison_hang.enqueue()
    if kind == "non_json_result":
        return tasks_faults.poison_object.enqueue()
    if kind == "system_exit":
        return tasks_faults.poison_exit.enqueue()
    job = tasks_faults.takes_one.enqueue(1)
    # Corrupt the stored row the way a bad migration or a hand-written INSERT would.
    sql = {
        "args_not_a_list": "UPDATE jobguard_job SET args = '42'::jsonb WHERE id = %s",
        "kwargs_not_an_object": "UPDATE jobguard_job SET kwargs = '[1]'::jsonb WHERE id = %s",
        "args_a_json_string": "UPDATE jobguard_job SET args = '\"1\"'::jsonb WHERE id = %s",
        "unknown_task": "UPDATE jobguard_job SET task_name = 'tests.testapp.tasks_faults.gone' WHERE id = %s",
    }[kind]
    with connection.cursor() as cursor:
        cursor.execute(sql, [job.pk])
    return job


@pytest.mark.scenario("T8")
def test_t8_poison_jobs_are_dead_lettered_with_their_reason_and_healthy_jobs_succeed(
    scenario, observer, workers
):
    healthy_total = scenario.size(500)
    scenario.parameters = {"healthy": healthy_total, "poison": dict.fromkeys(EXPECTED, COPIES), "workers": 3}
    poison: dict[int, str] = {}
    healthy: list[int] = []
    kinds = [kind for kind in EXPECTED for _ in range(COPIES)]
    per_gap = healthy_total // (len(kinds) + 1)
    for index in range(len(kinds) + 1):
        size = per_gap if index < len(kinds) else healthy_total - len(healthy)
        calls = [((), {"marker": f"t8-{len(healthy) + i}", "seconds": 0.01}) for i in range(size)]
        healthy += enqueue_probes(scenario.history, calls)
        if index < len(kinds):
            job = enqueue_poison(kinds[index])
            poison[job.pk] = kinds[index]
            scenario.history.record("enqueue_ok", job_ids=[job.pk], count=1, kind=kinds[index])

    pool = Pool(workers, scenario.history, observer, size=3, concurrency=2).start()
    drained = run_until(lambda: open_jobs(observer) == 0, timeout=300, tick=pool.reap_exits)
    alive_at_end = [s.worker_id for s in pool.live()]
    exit_codes = pool.stop()

    letters = {dl.job_id: dl for dl in DeadLetter.objects.all()}
    # A poison job whose last attempt was held by a worker another poison job killed is
    # rightly dead-lettered as lease_expired, whatever it would have done itself.
    orphaned = {job_id for death in pool.deaths for job_id, _ in death.orphans}
    outcome = {
        kind: sorted(
            {
                (letters[j].reason if j in letters else None, Job.objects.get(pk=j).attempts)
                for j, k in poison.items()
                if k == kind
            },
            key=str,
        )
        for kind in EXPECTED
    }
    healthy_succeeded = Job.objects.filter(pk__in=healthy, status="succeeded").count()
    figures = check(scenario.history, deaths=pool.deaths)
    # Every worker death must be the worker-killer's doing: the dead worker had started one.
    killers = {j for j, kind in poison.items() if kind == "kills_worker"}
    started = {(e["source"], e["job_id"]) for e in scenario.history.events() if e["event"] == "start"}
    unexplained = [d for d in pool.deaths if not any((d.worker_id, j) in started for j in killers)]
    violations = scenario.finish(
        **figures,
        drained=drained,
        poison_outcome={kind: [list(pair) for pair in pairs] for kind, pairs in outcome.items()},
        healthy_succeeded=healthy_succeeded,
        healthy_total=healthy_total,
        poison_orphaned_by_worker_deaths=sorted(poison[j] for j in poison if j in orphaned),
        worker_deaths_unexplained=len(unexplained),
        unexplained_deaths=[death.describe() for death in unexplained],
        exit_codes=exit_codes,
    )

    assert drained, figures["statuses"]
    for job_id, kind in poison.items():
        job = Job.objects.get(pk=job_id)
        got = (letters[job_id].reason if job_id in letters else None, job.attempts)
        expected = {EXPECTED[kind]}
        if job_id in orphaned:
            expected.add(("lease_expired", job.max_attempts))
        assert got in expected, (kind, job_id, got, expected)
    assert healthy_succeeded == healthy_total
    # At most one death per attempt of a worker-killer (fewer when one worker had claimed both).
    deaths = [death.describe() for death in pool.deaths]
    assert 1 <= len(pool.deaths) <= 2 * COPIES, (figures["worker_deaths"], deaths)
    assert unexplained == [], [death.describe() for death in unexplained]
    assert len(alive_at_end) == 3 and set(exit_codes.values()) == {0}, exit_codes
    assert (figures["lost"], figures["unexpected"], figures["duplicate_effects"]) == (0, 0, 0), figures
    assert not any(violations.values()), violations
