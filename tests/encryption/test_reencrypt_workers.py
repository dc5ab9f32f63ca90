"""manage.py jobguard_reencrypt while a real worker process runs encrypted jobs: nothing is lost,
nothing is left under the old key (tests/testapp/tasks_encrypted.py's task, through the worker's
own read and write paths)."""

from __future__ import annotations

import pytest

from django_jobguard.encryption.rotation import reencrypt
from django_jobguard.models import Job
from tests.conftest import wait_for
from tests.encryption.test_reencrypt import _field, _keys, _under, stored
from tests.support.rotation import K1, K2, set_keys

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["_keys"]  # the autouse fixture: the suite's keys put back after each test


@pytest.mark.processes
def test_reencrypting_while_a_worker_process_runs_encrypted_jobs_loses_nothing(workers):
    from tests.testapp import tasks_encrypted

    modes = ["retry_once" if n % 3 == 0 else "ok" for n in range(60)]
    calls = list(enumerate(modes))
    # 20 run under k1 first: their results, histories, progress and checkpoints under the old key.
    jobs = [tasks_encrypted.stash.enqueue(f"ref-{n}", mode=mode) for n, mode in calls[:20]]

    def burst_under_k1() -> bool:
        # A burst ends when nothing is due: a retry due a moment later needs another one.
        done = workers.burst("--concurrency", "1", env={"JOBGUARD_ENCRYPTION_KEYS": K1})
        assert done.returncode == 0, done.stdout.decode(errors="replace")[-3000:]
        return Job.objects.filter(status="succeeded").count() == 20

    wait_for(burst_under_k1, timeout=300, interval=0.2, message="the first 20 jobs to succeed under k1")
    # 40 queued under k1, to be run while the command goes.
    jobs += [tasks_encrypted.stash.enqueue(f"ref-{n}", mode=mode) for n, mode in calls[20:]]

    set_keys(K2, K1)
    worker = workers.start("--concurrency", "1", env={"JOBGUARD_ENCRYPTION_KEYS": f"{K2},{K1}"})
    workers.wait_started(worker)
    report = reencrypt("default", batch_size=3, sleep=0.02)
    wait_for(
        lambda: Job.objects.filter(status="succeeded").count() == len(jobs),
        timeout=300,
        message="the worker to finish every job",
    )

    pending = {name: field.raced for name, field in report.fields.items() if field.raced}
    assert report.complete and not report.failures, (pending, report.failures)
    assert report.fields["jobguard_job.args"].reencrypted > 0
    assert _under("k1") == 0
    for n, (job, mode) in enumerate(zip(jobs, modes, strict=True)):
        args = _field("Job", "args").decrypt(stored("Job", job.pk, "args"))
        kwargs = _field("Job", "kwargs").decrypt(stored("Job", job.pk, "kwargs"))
        result = _field("Job", "result").decrypt(stored("Job", job.pk, "result"))
        history = _field("Job", "attempt_history").decrypt(stored("Job", job.pk, "attempt_history"))
        assert (args, kwargs) == ([f"ref-{n}"], {"mode": mode})
        assert result == {"reference": f"ref-{n}", "note": None}
        assert len(history) == (2 if mode == "retry_once" else 1)
        if mode == "retry_once":
            assert history[0]["error"] == f"the first attempt of ref-{n} failed"
    assert worker.poll() is None, workers.log(worker)[-3000:]
