"""Three worker hosts as network namespaces: one partitioned mid-run, one with a skewed clock.

Every host reaches PostgreSQL (and Redis) only through a relay on its veth pair's far end
(tests/support/netns.py); the namespaces, links and relays are created and removed by each test.
"""

from __future__ import annotations

import datetime
import glob
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest
from django.db import connection
from django.db.models import F

from django_jobguard.models import DeadLetter, Job
from tests.conftest import ROOT, wait_for, worker_command, worker_env
from tests.support import netns
from tests.testapp import tasks
from tests.testapp.models import LedgerEntry

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
    pytest.mark.postgres,
    pytest.mark.slow,
]

HOSTS = 3
#: Seconds libfaketime moves a skewed host's wall clock (the issue's ±5 minutes).
SKEW_SECONDS = 300


@pytest.fixture
def hosts(tmp_path) -> Iterator[list[netns.Host]]:
    reason = netns.unavailable()
    if reason:
        pytest.skip(f"network-namespace hosts: {reason}")
    # The relay listens on the database's own port: host_env() gives the workers that port.
    db_port = int(connection.settings_dict["PORT"] or 5432)
    forward = [(db_port, (str(connection.settings_dict["HOST"] or "127.0.0.1"), db_port))]
    redis_url = os.environ.get("JOBGUARD_TEST_REDIS_URL", "")
    if redis_url:
        parsed = urlparse(redis_url)
        forward.append((parsed.port or 6379, (parsed.hostname or "127.0.0.1", parsed.port or 6379)))
    with netns.hosts(HOSTS, tmp_path, forward) as made:
        yield made


def host_env(host: netns.Host, **extra: str) -> dict[str, str]:
    """A worker's environment on ``host``: the database and Redis at its veth gateway."""
    db = connection.settings_dict
    url = f"postgres://{db['USER'] or 'postgres'}@{host.gateway}:{db['PORT'] or 5432}/x"
    env = worker_env(JOBGUARD_TEST_LOG_LEVEL="INFO", JOBGUARD_TEST_DATABASE_URL=url, **extra)
    redis_url = os.environ.get("JOBGUARD_TEST_REDIS_URL", "")
    if redis_url:
        parsed = urlparse(redis_url)
        env["JOBGUARD_TEST_REDIS_URL"] = f"redis://{host.gateway}:{parsed.port or 6379}{parsed.path}"
    return env


def libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else ""


def skewed(env: dict[str, str], skew: int) -> dict[str, str]:
    """libfaketime preloaded (not the faketime wrapper, which would not pass SIGTERM on)."""
    # Wall clock only: a faked monotonic clock would break every timed wait.
    return {**env, "LD_PRELOAD": libfaketime(), "FAKETIME": f"{skew:+d}", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def start_worker(host: netns.Host, *args: str, skew: int = 0):
    env = host_env(host)
    if skew:
        env = skewed(env, skew)
        clock = subprocess.run(
            [sys.executable, "-c", "import time; print(time.time())"],
            env=env,
            capture_output=True,
            check=True,
        )
        assert abs(float(clock.stdout) - time.time() - skew) < 30, "libfaketime did not skew the clock"
    proc = host.start(worker_command("--worker-id", f"host{host.index}", *args), env=env)
    wait_for(lambda: "worker_started" in host.log(proc), timeout=60, message=f"a worker on host {host.index}")
    return proc


@pytest.mark.scenario("netns-partition")
def test_a_partitioned_hosts_jobs_are_finished_by_the_others_and_its_late_acks_are_refused(scenario, hosts):
    os.chdir(ROOT)
    count = 40
    jobs = [tasks.short_lease.enqueue(f"part{n}", seconds=1.0, per_attempt=True) for n in range(count)]
    procs = [start_worker(host, "--concurrency", "2") for host in hosts]
    cut = hosts[0]
    wait_for(
        lambda: Job.objects.filter(worker_id="host0", status="running").exists(),
        timeout=60,
        interval=0.05,
        message="host 0 to hold a running job",
    )
    cut.partition()
    partitioned_at = time.time()
    stranded = list(Job.objects.filter(worker_id="host0", status="running").values_list("pk", flat=True))
    try:
        wait_for(
            lambda: Job.objects.filter(status="succeeded").count() == count,
            timeout=300,
            interval=0.2,
            message="hosts 1 and 2 to finish every job, host 0's included",
        )
        recovered_at = time.time()
    finally:
        cut.heal()
    # Healed: host 0 finishes its stale attempts, and their acks find the lease moved on.
    wait_for(
        lambda: "ack_rejected" in cut.log(procs[0]) or "lease_lost" in cut.log(procs[0]),
        timeout=180,
        message="host 0's late ack or heartbeat to be refused",
    )
    for job in jobs:
        job.refresh_from_db()
    assert {job.status for job in jobs} == {"succeeded"}
    assert not DeadLetter.objects.exists()
    assert stranded
    assert {job.worker_id for job in jobs if job.pk in stranded} <= {"host1", "host2"}
    # Nothing done twice: one committed effect per job, from the attempt that was acked.
    effects = Counter(LedgerEntry.objects.values_list("job_id", flat=True))
    assert effects == Counter({job.pk: 1 for job in jobs})
    for job in jobs:
        assert LedgerEntry.objects.get(job_id=job.pk).effect_key == f"{job.args[0]}:{job.attempts}"
    scenario.parameters = {"hosts": HOSTS, "lease_seconds": 2, "partitioned_host": 0}
    violations = scenario.finish(
        jobs=count,
        stranded_on_partitioned_host=len(stranded),
        lost=count - Job.objects.filter(status="succeeded").count(),
        duplicate_effects=sum(n - 1 for n in effects.values()),
        recovery_seconds=round(recovered_at - partitioned_at, 1),
    )
    assert not any(violations.values()), violations


@pytest.mark.skipif(not libfaketime(), reason="needs libfaketime (apt-get install faketime)")
@pytest.mark.scenario("netns-skew")
def test_hosts_with_clocks_five_minutes_off_neither_reap_live_leases_nor_start_jobs_early(scenario, hosts):
    os.chdir(ROOT)
    start_worker(hosts[0], "--concurrency", "2", skew=SKEW_SECONDS)
    start_worker(hosts[1], "--concurrency", "2", skew=-SKEW_SECONDS)
    start_worker(hosts[2], "--concurrency", "2")
    # Enqueued once all three listen, so each host's first claim takes its share: a host that
    # started alone could drain these short jobs before the others are up.
    # Handlers that do not call time.sleep (libfaketime breaks clock_nanosleep when only the
    # wall clock is faked); the default queue's 30 s lease.
    records = tasks.record.bulk_enqueue([((f"skew{n}",), {}) for n in range(120)])
    delayed = tasks.add.using(run_after=datetime.timedelta(seconds=4)).bulk_enqueue(
        [((n,), {}) for n in range(12)]
    )
    retried = [tasks.flaky.enqueue(f"flaky{n}", failures=2) for n in range(6)]
    total = len(records) + len(delayed) + len(retried)
    wait_for(
        lambda: Job.objects.filter(status="succeeded").count() == total,
        timeout=300,
        interval=0.2,
        message="every job to succeed on the skewed hosts",
    )
    assert not DeadLetter.objects.exists()
    workers_seen = set(Job.objects.values_list("worker_id", flat=True))
    assert {"host0", "host1"} <= workers_seen, workers_seen  # the skewed hosts did work
    # Leases follow the database clock: a host 5 minutes ahead would have reaped live leases.
    assert set(Job.objects.values_list("reappearances", flat=True)) == {0}
    # run_after follows the database clock: no delayed job started before it was due, and
    # retries waited their backoff (2 failures each, then success on attempt 3).
    delayed_ids = [job.pk for job in delayed]
    assert not Job.objects.filter(pk__in=delayed_ids, started_at__lt=F("run_after")).exists()
    assert set(Job.objects.filter(pk__in=[job.pk for job in retried]).values_list("attempts", flat=True)) == {
        3
    }
    assert not Job.objects.filter(pk__in=[job.pk for job in retried], started_at__lt=F("run_after")).exists()
    scenario.parameters = {"hosts": HOSTS, "skews_seconds": [SKEW_SECONDS, -SKEW_SECONDS, 0]}
    violations = scenario.finish(
        jobs=total,
        lost=total - Job.objects.filter(status="succeeded").count(),
        early_starts=Job.objects.filter(started_at__lt=F("run_after")).count(),
        premature_reclaims=Job.objects.filter(reappearances__gt=0).count(),
        duplicate_effects=LedgerEntry.objects.count() - len(records),
    )
    assert not any(violations.values()), violations
    # Stopped cleanly on their skewed clocks too.
    for host in hosts:
        for proc in host.procs:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, host.log(proc)[-2000:]
