"""Cache invalidation and versioned writes across real processes.

- Several writer processes race versioned writes to one Redis key: the compare-and-set is
  atomic on the server.
- A real worker runs an atomic task that credits an account and invalidates its cached
  balance: the key goes only once the job's ack committed, and not at all when the ack is
  refused. The cache is the file-based alias "files", which the worker process shares with
  the test (local memory is per process).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from django.core.cache import caches
from prometheus_client import REGISTRY

from django_jobguard.cache import get_versioned
from django_jobguard.models import Job
from tests.conftest import ROOT, wait_for, worker_env
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


@pytest.mark.postgres
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
