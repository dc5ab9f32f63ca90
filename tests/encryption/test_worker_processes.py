"""Real ``jobguard_worker`` processes and encrypted jobs: a run, a tampered ciphertext, a missing key.

A job whose stored arguments cannot be decrypted never runs: it is dead-lettered as permanent,
its error naming the key, and its stored payload stays exactly as it was, so that it replays
once the key is back.
"""

from __future__ import annotations

import pytest

from django_jobguard import dlq
from django_jobguard.encryption.payloads import open_json
from django_jobguard.exceptions import ReplayError
from django_jobguard.models import DeadLetter, Job
from tests.conftest import wait_for
from tests.encryption.support import (
    OLD_KEY,
    SUITE_KEY,
    assert_sealed,
    drain_processes,
    keys,
    stored,
    tampered,
    write_raw_args,
)
from tests.support.factories import make_user
from tests.testapp import tasks_encrypted

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def test_a_worker_process_runs_an_encrypted_job_and_stores_its_result_sealed(workers):
    job = tasks_encrypted.stash.enqueue("proc-1", mode="retry_once", note={"iban": "DE89"})
    drain_processes(workers, SUITE_KEY)
    row = stored(job.pk, "status", "result", "attempt_history")
    assert row["status"] == "succeeded"
    assert_sealed(row["result"])
    assert_sealed(row["attempt_history"][0]["error"])
    assert Job.objects.get(pk=job.pk).wait(timeout=5) == {"reference": "proc-1", "note": {"iban": "DE89"}}


def test_a_tampered_ciphertext_dead_letters_the_job_as_permanent_and_leaves_it_as_it_was(workers):
    job = tasks_encrypted.stash.enqueue("proc-2")
    altered = tampered(stored(job.pk, "args")["args"])
    write_raw_args(job, altered)

    drain_processes(workers, SUITE_KEY)
    letter = DeadLetter.objects.get(job=job)
    assert (letter.reason, letter.category) == ("invalid_payload", "permanent")
    assert letter.error_class == "django_jobguard.encryption.DecryptionError"
    assert letter.error_message.startswith("cannot decrypt job.args: its authentication tag does not match")
    row = stored(job.pk, "status", "args", "attempt_history")
    assert row["status"] == "dead"
    assert row["args"] == altered  # the stored payload is exactly as it was
    assert letter.args == altered
    # The handler never ran: its first step writes a checkpoint.
    assert stored(job.pk, "checkpoints")["checkpoints"] == {}


def test_a_worker_started_without_a_key_stored_values_use_says_so_and_still_runs(workers):
    with keys(OLD_KEY):
        job = tasks_encrypted.stash.enqueue("proc-4", note={"pan": "4111"})
    assert_sealed(stored(job.pk, "args")["args"], "old1")
    worker = workers.start("--concurrency", "1", env={"JOBGUARD_ENCRYPTION_KEYS": SUITE_KEY})
    workers.wait_started(worker)
    wait_for(lambda: DeadLetter.objects.filter(job=job).exists(), 60, message="the job to be dead-lettered")
    workers.stop_all()
    log = workers.log(worker)
    assert "encryption_key_missing check=jobguard.E081" in log
    assert "key 'old1', which is not configured" in log


def test_a_missing_key_dead_letters_the_job_naming_the_key_and_a_replay_runs_once_it_is_back(workers):
    # A worker started without key old1 (its start-up check passes: no row uses old1 yet) meets
    # a job an enqueuer sealed with old1, as after a key was dropped from one deployment only.
    worker = workers.start("--concurrency", "1", env={"JOBGUARD_ENCRYPTION_KEYS": SUITE_KEY})
    workers.wait_started(worker)
    with keys(OLD_KEY):
        job = tasks_encrypted.stash.enqueue("proc-3", note={"pan": "4111"})
    before = stored(job.pk, "args", "kwargs")
    assert_sealed(before["args"], "old1")

    wait_for(lambda: DeadLetter.objects.filter(job=job).exists(), 60, message="the job to be dead-lettered")
    workers.stop_all()
    letter = DeadLetter.objects.get(job=job)
    assert (letter.reason, letter.category) == ("invalid_payload", "permanent")
    assert letter.error_message == (
        "cannot decrypt job.args: key 'old1' is not in JOBGUARD['ENCRYPTION']['KEYS']"
    )
    assert stored(job.pk, "args", "kwargs") == before  # left intact, still encrypted
    assert (letter.args, letter.kwargs) == (before["args"], before["kwargs"])
    assert stored(job.pk, "checkpoints")["checkpoints"] == {}  # the handler never ran
    # Without the key the operator is told what is missing; nothing decrypts to garbage.
    with pytest.raises(ReplayError, match="key 'old1'"):
        dlq.request_replay(letter, make_user("rita", "request_replay", "view_payload"), "retry")

    with keys(SUITE_KEY, OLD_KEY):  # the key is back
        dlq.request_replay(letter, make_user("ruth", "request_replay", "view_payload"), "key restored")
        letter.refresh_from_db()
        dlq.approve_replay(letter, make_user("amos", "approve_replay", "view_payload"), "ok")
    drain_processes(workers, SUITE_KEY, OLD_KEY)
    replay = DeadLetter.objects.get(pk=letter.pk).replay_job
    assert replay is not None
    with keys(SUITE_KEY, OLD_KEY):
        assert replay.wait(timeout=5) == {"reference": "proc-3", "note": {"pan": "4111"}}
        assert open_json(stored(replay.pk, "args")["args"], "args", "job.args") == ["proc-3"]
