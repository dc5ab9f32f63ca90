"""T11: SIGTERM and a double SIGINT while jobs run.

The documented policy (``django_jobguard.worker``): a signal stops the claiming; jobs not
started are handed back at once; running jobs get the shutdown grace period; what still
runs then is handed back with its attempt refunded, and runs again elsewhere. A second
signal skips the grace period. Either way the worker exits 0 and nothing is lost.
"""

import signal
import time

import pytest

from django_jobguard.models import Job
from tests.conftest import wait_for
from tests.testapp import tasks_faults
from tests.testapp.models import JobTransition

from .harness import Pool, check, enqueue_probes, open_jobs

pytestmark = [pytest.mark.reliability, pytest.mark.postgres, pytest.mark.processes, pytest.mark.slow]

GRACE = 2.0
LONG_SECONDS = 8.0


def _enqueue_long(scenario, name):
    task = tasks_faults.probe.using(priority=50)  # claimed before the short jobs
    return enqueue_probes(
        scenario.history,
        [((), {"marker": f"t11-{name}-{i}", "seconds": LONG_SECONDS}) for i in range(2)],
        task=task,
    )


def _started(history, worker_id, ids):
    return {
        e["job_id"] for e in history.events() if e["event"] == "start" and e["source"] == worker_id
    } >= set(ids)


def _stop(proc, signals, pause=0.3):
    began = time.monotonic()
    for index, signum in enumerate(signals):
        if index:
            time.sleep(pause)
        proc.send_signal(signum)
    code = proc.wait(timeout=120)
    return code, round(time.monotonic() - began, 2)


@pytest.mark.scenario("T11")
def test_t11_sigterm_and_double_sigint_exit_zero_and_hand_back_what_still_runs(scenario, observer, workers):
    history = scenario.history
    shorts = scenario.size(300)
    scenario.parameters = {"short_jobs": shorts, "long_jobs": 4, "long_seconds": LONG_SECONDS, "grace": GRACE}
    # Two slots each, both taken by the long jobs, so each worker holds exactly its own.
    grace_args = ["--batch-size", "2", "--shutdown-grace", str(GRACE)]

    term_long = _enqueue_long(scenario, "term")
    term = Pool(workers, history, observer, size=1, concurrency=2, extra_args=grace_args, name="term").start()
    t = term.slots[0]
    wait_for(lambda: _started(history, t.worker_id, term_long), timeout=60, message="SIGTERM worker's jobs")

    int_long = _enqueue_long(scenario, "int")
    sigint = Pool(
        workers,
        history,
        observer,
        size=1,
        concurrency=2,
        name="int",
        extra_args=["--batch-size", "2", "--shutdown-grace", "600"],
    ).start()
    i = sigint.slots[0]
    wait_for(lambda: _started(history, i.worker_id, int_long), timeout=60, message="SIGINT worker's jobs")

    enqueue_probes(history, [((), {"marker": f"t11-short-{n}", "seconds": 0.05}) for n in range(shorts)])

    term_code, term_seconds = _stop(t.proc, [signal.SIGTERM])
    int_code, int_seconds = _stop(i.proc, [signal.SIGINT, signal.SIGINT])
    history.record("worker_stopped_by_test", worker_id=t.worker_id, code=term_code, seconds=term_seconds)
    history.record("worker_stopped_by_test", worker_id=i.worker_id, code=int_code, seconds=int_seconds)

    # The long jobs were given back at once with their attempt refunded (not left to expire).
    long_ids = term_long + int_long
    handed_back = JobTransition.objects.filter(
        job_id__in=long_ids, old_status="running", new_status="queued", attempts=0
    ).count()
    states_after_stop = sorted(Job.objects.filter(pk__in=long_ids).values_list("status", "attempts"))

    drain = Pool(workers, history, observer, size=1, concurrency=3, name="drain").start()
    wait_for(lambda: open_jobs(observer) == 0, timeout=180, message="the drain worker to finish everything")
    drain_codes = drain.stop()

    refusal_events = [
        e
        for e in history.events()
        if e["event"] == "job_handed_back" and e["source"] in (t.worker_id, i.worker_id)
    ]
    figures = check(history)
    violations = scenario.finish(
        **figures,
        sigterm={"exit_code": term_code, "seconds_to_exit": term_seconds},
        double_sigint={"exit_code": int_code, "seconds_to_exit": int_seconds},
        long_jobs_handed_back_with_attempt_refunded=handed_back,
        long_job_states_after_stop=[list(s) for s in states_after_stop],
        hand_back_log_records=len(refusal_events),
        long_job_final=sorted(Job.objects.filter(pk__in=long_ids).values_list("status", "attempts")),
        drain_exit_codes=drain_codes,
    )

    assert (term_code, int_code) == (0, 0)
    # SIGTERM waited for the grace period, not for the 8 s jobs; the double SIGINT did not wait at all.
    assert term_seconds < LONG_SECONDS, term_seconds
    assert int_seconds < GRACE + LONG_SECONDS, int_seconds
    assert handed_back == 4
    assert states_after_stop == [("queued", 0)] * 4
    assert (
        sorted(Job.objects.filter(pk__in=long_ids).values_list("status", "attempts"))
        == [("succeeded", 1)] * 4
    )
    assert (figures["lost"], figures["unexpected"]) == (0, 0), figures
    assert (figures["duplicated_executions"], figures["duplicate_effects"]) == (0, 0), figures
    assert figures["statuses"] == {"succeeded": shorts + 4}
    assert set(drain_codes.values()) == {0}
    assert not any(violations.values()), violations
