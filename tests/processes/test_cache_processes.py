"""Cache invalidation and versioned writes across real processes.

- Several writer processes race versioned writes to one Redis key: the compare-and-set is
  atomic on the server.
- A real worker runs an atomic task that credits an account and invalidates its cached
  balance: the key goes only once the job's ack committed, and not at all when the ack is
  refused. The cache is the file-based alias "files", which the worker process shares with
  the test (local memory is per process).
- Durable invalidation: a writer whose Redis is down at commit, and a writer killed between
  its commit and its on_commit delete; in both a real worker deletes the key afterwards.
- get_or_set(): 4 processes x 5 threads missing one key call the loader once.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from django.conf import settings
from django.core.cache import caches
from django.db import transaction
from django.test import override_settings
from django_redis import get_redis_connection
from prometheus_client import REGISTRY

from django_jobguard.cache import get_versioned, invalidate
from django_jobguard.models import Job
from tests.conftest import ROOT, wait_for, worker_env
from tests.support.redis_server import RedisServer
from tests.testapp import tasks_cache
from tests.testapp.models import Account, Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

WRITERS, WRITES = 4, 500


@pytest.mark.redis
@pytest.mark.slow
def test_racing_processes_never_let_an_older_or_equal_version_win():
    key = f"test:cas:{uuid.uuid4().hex}"
    rejected_before = REGISTRY.get_sample_value(
        "jobguard_cache_stale_writes_rejected_total", {"cache": "redis"}
    )
    writers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.processes.versioned_writer", "redis", key, str(seed), str(WRITES)],
            cwd=ROOT,
            env=worker_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for seed in range(WRITERS)
    ]
    for writer in writers:
        assert writer.stdout.readline().strip() == b"ready", writer.stderr.read().decode()
    for writer in writers:  # all connected: start them together
        writer.stdin.write(b"go\n")
        writer.stdin.flush()
    outputs = [writer.communicate(timeout=120) for writer in writers]
    results = []
    for writer, (out, err) in zip(writers, outputs, strict=True):
        assert writer.returncode == 0, err.decode()
        results.append(json.loads(out))

    assert get_versioned(key, cache_alias="redis").version == WRITES
    accepted = Counter(version for result in results for version, ok in result if ok)
    # Each version was offered by every writer: an atomic compare-and-set takes it once at most.
    assert max(accepted.values()) == 1, [v for v, n in accepted.items() if n > 1]
    for result in results:
        # The stored version only grows, so what one writer got accepted only grows too.
        mine = [version for version, ok in result if ok]
        assert mine == sorted(mine)
    # Every refusal was of a version not above the stored one, and there were many of them.
    total = WRITERS * WRITES
    refused = total - sum(accepted.values())
    assert refused >= total - WRITES
    # Counted in the writer processes, not here.
    assert (
        REGISTRY.get_sample_value("jobguard_cache_stale_writes_rejected_total", {"cache": "redis"})
        == rejected_before
    )


def status_of(job: Job) -> str:
    job.refresh_from_db()
    return job.status


@pytest.fixture
def cached_balance():
    """An account, and its balance cached under a fresh key of the shared "files" cache."""
    account = Account.objects.create(owner="cache", balance=100)
    key = f"test:account:{account.pk}:balance:{uuid.uuid4().hex}"
    caches["files"].set(key, 100)
    return account, key


def test_an_atomic_task_invalidates_only_once_its_ack_committed(workers, tmp_path: Path, cached_balance):
    account, key = cached_balance
    gate = tmp_path / "gate"
    job = tasks_cache.credit.enqueue(account.pk, 5, key, "files", gate=str(gate))
    workers.start()
    # The handler has written and called invalidate(), and now waits inside its transaction.
    wait_for(lambda: Path(f"{gate}.reached").exists(), 60, message="the handler to reach the gate")
    assert caches["files"].get(key) == 100
    assert status_of(job) == "running"
    assert Account.objects.get(pk=account.pk).balance == 100  # not committed yet
    gate.touch()
    wait_for(lambda: caches["files"].get(key) is None, 60, message="the key to be invalidated")
    # on_commit runs after the commit: the ack and the new balance are already visible.
    assert status_of(job) == "succeeded"
    assert Account.objects.get(pk=account.pk).balance == 105


def test_a_refused_ack_rolls_back_the_invalidation_with_the_write(workers, tmp_path: Path, cached_balance):
    # The handler moves its own lease token inside the ack's transaction, as another worker
    # taking the job over would: the fenced ack finds no row and the transaction rolls back.
    account, key = cached_balance
    gate = tmp_path / "gate"
    job = tasks_cache.credit.enqueue(account.pk, 5, key, "files", refuse_first_ack=True, gate=str(gate))
    proc = workers.start()
    wait_for(lambda: Path(f"{gate}.reached").exists(), 60, message="the first attempt to reach the gate")
    Path(f"{gate}.reached").unlink()
    gate.touch()
    wait_for(lambda: "ack_rejected" in workers.log(proc), 60, message="the first attempt's ack to be refused")
    # The first attempt's write and its invalidation rolled back with the refused ack.
    assert caches["files"].get(key) == 100
    assert Account.objects.get(pk=account.pk).balance == 100
    # Its lease runs out; the second attempt commits, and only then is the key deleted.
    wait_for(lambda: status_of(job) == "succeeded", 60, message="the second attempt to succeed")
    assert job.attempts == 2
    wait_for(lambda: caches["files"].get(key) is None, 30, message="the second attempt's invalidation")
    assert Account.objects.get(pk=account.pk).balance == 105


@pytest.mark.server_db
def test_a_frozen_workers_late_ack_does_not_invalidate(workers, cached_balance):
    # The stale-ack method of test_crash.py: the first worker freezes past its 2 s lease, a
    # healthy one finishes the job, then the first wakes and its fenced ack is refused.
    # PostgreSQL only: on SQLite a writer frozen inside its transaction blocks every other writer.
    account, key = cached_balance
    job = tasks_cache.credit.enqueue(account.pk, 5, key, "files", sleep_first=4.0)
    frozen = workers.start("--worker-id", "frozen")
    wait_for(lambda: status_of(job) == "running", message="the first worker to claim the job")
    frozen.send_signal(signal.SIGSTOP)  # no heartbeat: its lease runs out
    workers.start("--worker-id", "healthy")
    wait_for(lambda: status_of(job) == "succeeded", timeout=60, message="the healthy worker to finish it")
    assert job.worker_id == "healthy"
    wait_for(lambda: caches["files"].get(key) is None, 30, message="the healthy worker's invalidation")
    caches["files"].set(key, "refilled after the healthy commit")
    frozen.send_signal(signal.SIGCONT)
    # The frozen worker wakes, runs the rest of its handler (invalidate() included), and its
    # fenced ack finds the token gone: the write and the invalidation roll back together.
    wait_for(lambda: "ack_rejected" in workers.log(frozen), timeout=30, message="the stale ack to be refused")
    assert caches["files"].get(key) == "refilled after the healthy commit"
    assert Account.objects.get(pk=account.pk).balance == 105
    assert list(Execution.objects.filter(marker=key).values_list("attempt", flat=True)) == [2]


# -- durable invalidation ----------------------------------------------------------------

DURABLE_TASK = "django_jobguard.cache.delete_keys"


def durable_job() -> Job:
    (job,) = Job.objects.filter(task_name=DURABLE_TASK)
    return job


@pytest.fixture
def private_redis(tmp_path: Path):
    if shutil.which("redis-server") is None:
        pytest.skip("needs the redis-server binary to run a Redis of the test's own")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.mark.redis
@pytest.mark.slow
def test_a_durable_invalidation_is_done_by_a_worker_once_redis_is_back_and_a_plain_one_is_lost(
    private_redis, workers
):
    durable_key, plain_key = f"test:durable:{uuid.uuid4().hex}", f"test:plain:{uuid.uuid4().hex}"
    redis_alias = {
        **settings.CACHES["redis"],
        "LOCATION": private_redis.url,
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
    }
    # Many attempts: the worker keeps retrying (with the test settings' fast backoff) while
    # Redis is down, however long the machine takes.
    patient = {**settings.JOBGUARD, "CACHE": {"MAX_ATTEMPTS": 10_000, "DURABLE_DELAY": 0.5}}
    with override_settings(CACHES={**settings.CACHES, "redis": redis_alias}, JOBGUARD=patient):
        cache = caches["redis"]
        cache.set_many({durable_key: "old", plain_key: "old"})
        get_redis_connection("redis").save()  # the restart below brings these values back
        private_redis.stop()
        with transaction.atomic():
            Account.objects.create(owner="durable-writer")
            invalidate(durable_key, cache_alias="redis", durable=True)
            invalidate(plain_key, cache_alias="redis")
        # Both deletes failed after the commit; the durable one left its job.
        job = durable_job()
        assert job.status == "queued" and job.queue_name == "jobguard.cache"
        worker = workers.start(
            "--queue", "jobguard.cache", env={"JOBGUARD_TEST_REDIS_URL": private_redis.url}
        )
        wait_for(
            lambda: Job.objects.get(pk=job.pk).attempts >= 2,
            timeout=120,
            message="the worker to retry the invalidation while Redis is down",
        )
        assert "job_retry" in workers.log(worker) and "TransientError" in workers.log(worker)
        private_redis.start()
        assert cache.get(plain_key) == "old"  # the data came back with the restart
        wait_for(lambda: cache.get(durable_key) is None, timeout=120, message="the worker to delete the key")
        wait_for(lambda: status_of(job) == "succeeded", timeout=60, message="the job to be acked")
        # Without durable=True the delete was logged and lost: the old value stays until it expires.
        assert cache.get(plain_key) == "old"


def test_a_writer_killed_between_commit_and_on_commit_leaves_the_key_to_a_worker(workers):
    key = f"test:killed:{uuid.uuid4().hex}"
    caches["files"].set(key, "old")
    writer = subprocess.run(
        [sys.executable, "-m", "tests.processes.durable_writer", "files", key, "killed-writer"],
        cwd=ROOT,
        env=worker_env(JOBGUARD_TEST_FAULTS="cache_after_commit=1"),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert writer.returncode == -signal.SIGKILL, writer.stderr.decode()
    assert b"on_commit ran" not in writer.stdout
    # The write committed, the delete never ran: the key is stale and only the job knows.
    assert Account.objects.filter(owner="killed-writer").exists()
    assert caches["files"].get(key) == "old"
    job = durable_job()
    assert job.kwargs == {"keys": {"files": {key: None}}}
    workers.start("--queue", "jobguard.cache")
    wait_for(lambda: caches["files"].get(key) is None, timeout=120, message="the worker to delete the key")
    wait_for(lambda: status_of(job) == "succeeded", timeout=60, message="the job to be acked")


# -- get_or_set(): one loader call across processes ---------------------------------------

READERS, THREADS = 4, 5


@pytest.mark.redis
@pytest.mark.parametrize("mode", ["ok", "fail"])
def test_processes_and_threads_missing_one_key_call_the_loader_once(mode):
    key, counter = f"test:stampede:{uuid.uuid4().hex}", f"test:stampede-calls:{uuid.uuid4().hex}"
    readers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.processes.refill_reader",
                "redis",
                key,
                counter,
                str(THREADS),
                mode,
            ],
            cwd=ROOT,
            env=worker_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(READERS)
    ]
    for reader in readers:
        assert reader.stdout.readline().strip() == b"ready", reader.stderr.read().decode()
    for reader in readers:  # all connected: start them together
        reader.stdin.write(b"go\n")
        reader.stdin.flush()
    results: list[str] = []
    for reader in readers:
        out, err = reader.communicate(timeout=300)
        assert reader.returncode == 0, err.decode()
        results += json.loads(out)
    calls = int(get_redis_connection("redis").get(counter))
    if mode == "ok":
        assert calls == 1
        assert results == ["loaded by call 1"] * READERS * THREADS
    else:
        # The first loader raised and released the lease; the next caller loaded for everyone.
        assert calls == 2
        assert sorted(results) == ["error: the first load failed"] + ["loaded by call 2"] * (
            READERS * THREADS - 1
        )
