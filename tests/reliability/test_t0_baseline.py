"""T0: no faults. 5,000 probe jobs, 4 worker processes: nothing lost, nothing run twice."""

import pytest

from .harness import Pool, check, enqueue_probes, open_jobs, run_until, throughput

pytestmark = [pytest.mark.reliability, pytest.mark.postgres, pytest.mark.processes, pytest.mark.slow]


@pytest.mark.scenario("T0")
def test_t0_without_faults_every_job_runs_exactly_once(scenario, observer, workers):
    total = scenario.size(5000)
    scenario.parameters = {"jobs": total, "workers": 4, "concurrency": 2, "faults": "none"}
    enqueue_probes(scenario.history, [((), {"marker": f"t0-{i}"}) for i in range(total)])
    pool = Pool(workers, scenario.history, observer, size=4, concurrency=2, seed=str(scenario.seed)).start()
    drained = run_until(lambda: open_jobs(observer) == 0, timeout=600, tick=pool.reap_exits)
    exit_codes = pool.stop()

    figures = check(scenario.history, deaths=pool.deaths)
    violations = scenario.finish(**figures, **throughput(), drained=drained, exit_codes=exit_codes)

    assert drained, f"jobs still open after 600 s: {figures['statuses']}"
    assert (figures["lost"], figures["unexpected"]) == (0, 0), figures
    assert figures["duplicated_executions"] == 0, figures
    assert figures["duplicate_effects"] == 0, figures
    assert figures["statuses"] == {"succeeded": total}, figures
    assert figures["claims"] == total, "without faults every job is claimed exactly once"
    assert figures["worker_deaths"] == {"harness": 0, "self": 0}
    assert set(exit_codes.values()) == {0}, exit_codes
    assert not any(violations.values()), violations
