"""Payloads of ``@task(encrypt=True)`` are stored encrypted in every field, and read back in clear.

Runs on SQLite and on the configured server database; the worker is the real one, in this
process (tests/support/dlq.run_burst); tests/encryption/test_worker_processes.py runs it in its own.
"""

from __future__ import annotations

import datetime
import json

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_jobguard import dlq, schedules, store
from django_jobguard.encryption import DecryptionError, is_encrypted
from django_jobguard.encryption.payloads import ARGS, ERROR, KWARGS, open_json, open_text, seal_json_text
from django_jobguard.exceptions import JobFailed, PayloadTooLargeError
from django_jobguard.models import DeadLetter, IdempotencyKey, Job, ReplayEvent, Schedule
from django_jobguard.testing import assert_enqueued, frozen_time, run_jobs
from tests.encryption.support import NEW_KEY, SUITE_KEY, assert_sealed, drain, keys, raw_row, stored
from tests.support.factories import make_user
from tests.testapp import tasks, tasks_encrypted

pytestmark = pytest.mark.django_db(transaction=True)


def test_enqueue_stores_arguments_encrypted_and_the_returned_job_holds_them_in_clear():
    job = tasks_encrypted.stash.enqueue("ref-1", note={"card": "4242"})
    assert (job.args, job.kwargs) == (["ref-1"], {"note": {"card": "4242"}})
    row = stored(job.pk, "args", "kwargs")
    assert_sealed(row["args"])
    assert_sealed(row["kwargs"])
    assert "4242" not in str(row) and "ref-1" not in str(row)
    assert open_json(row["kwargs"], "kwargs", "job.kwargs") == {"note": {"card": "4242"}}

    plain = tasks.add.enqueue(1, b=2)
    assert stored(plain.pk, "args", "kwargs") == {"args": [1], "kwargs": {"b": 2}}


def test_bulk_enqueue_seals_every_row():
    jobs = tasks_encrypted.echo.bulk_enqueue([((f"v{n}",), {}) for n in range(3)])
    for n, job in enumerate(jobs):
        row = stored(job.pk, "args")
        assert_sealed(row["args"])
        assert open_json(row["args"], ARGS, "job.args") == [f"v{n}"]


def test_a_run_stores_result_errors_history_progress_checkpoints_and_key_result_encrypted():
    job = tasks_encrypted.stash.using(idempotency_key="stash-k").enqueue("ref-2", mode="retry_once")
    drain()
    row = stored(job.pk, "status", "result", "last_error", "progress", "checkpoints", "attempt_history")
    assert row["status"] == "succeeded"
    assert_sealed(row["result"])
    assert_sealed(row["checkpoints"])
    assert_sealed(row["last_error"])
    assert_sealed(row["progress"]["message"])
    assert (row["progress"]["done"], row["progress"]["total"]) == (1, 2)  # numbers stay readable
    failed, succeeded = row["attempt_history"]
    assert failed["error_class"] == "django_jobguard.exceptions.TransientError"  # the class stays readable
    assert_sealed(failed["error"])
    assert_sealed(failed["traceback"])
    assert "error" not in succeeded
    assert "ref-2" not in str(row)

    # Read back in clear through the public ways of reading them.
    job.refresh_from_db()
    assert job.wait(timeout=5) == {"reference": "ref-2", "note": None}
    assert open_text(row["last_error"], ERROR, "job.last_error") == (
        "django_jobguard.exceptions.TransientError: the first attempt of ref-2 failed"
    )
    assert "the first attempt of ref-2 failed" in open_text(failed["traceback"], "traceback", "t")
    assert open_json(row["checkpoints"], "checkpoints", "c") == {"seen": {"reference": "ref-2"}}
    (progress,) = list(Job.objects.get(pk=job.pk).watch(timeout=5))
    assert progress["message"] == "working on ref-2"

    key = IdempotencyKey.objects.get(job_id=job.pk)
    key_row = raw_row("jobguard_idempotencykey", key.pk, "result")
    assert_sealed(key_row["result"])
    # A duplicate enqueue under the key returns the same job; it does not conflict on the ciphertext.
    assert tasks_encrypted.stash.using(idempotency_key="stash-k").enqueue("ref-2", mode="retry_once") == job


def test_a_dead_letter_keeps_its_payload_and_errors_sealed_and_a_correction_is_sealed_too():
    job = tasks_encrypted.stash.enqueue("ref-3", mode="fail")
    drain()
    letter = DeadLetter.objects.get(job=job)
    row = raw_row("jobguard_deadletter", letter.pk, "args", "kwargs", "error_message", "traceback")
    for value in row.values():
        assert_sealed(value)
    assert row["args"] == stored(job.pk, "args")["args"]  # copied as stored
    assert open_text(row["error_message"], ERROR, "e") == "cannot take ref-3"
    with pytest.raises(JobFailed) as failed:
        Job.objects.get(pk=job.pk).wait(timeout=5)
    assert failed.value.error_message == "cannot take ref-3"

    requester = make_user("rita", "request_replay", "view_payload")
    approver = make_user("amos", "approve_replay", "view_payload")
    dlq.request_replay(letter, requester, "fix the mode", args=["ref-3-fixed"], kwargs={"mode": "ok"})
    corrected = raw_row("jobguard_deadletter", letter.pk, "replay_args", "replay_kwargs")
    assert_sealed(corrected["replay_args"])
    assert_sealed(corrected["replay_kwargs"])
    event = ReplayEvent.objects.get(dead_letter=letter, action="requested")
    assert_sealed(event.data["args"])
    assert "ref-3-fixed" not in str(event.data)
    assert dlq.review_correction(DeadLetter.objects.get(pk=letter.pk)).changes  # compared in clear

    letter.refresh_from_db()
    dlq.approve_replay(letter, approver, "ok", reviewed=dlq.correction_digest(letter))
    drain()
    replay = DeadLetter.objects.get(pk=letter.pk).replay_job
    assert replay is not None and replay.status == "succeeded"
    assert_sealed(stored(replay.pk, "args")["args"])
    assert replay.wait(timeout=5) == {"reference": "ref-3-fixed", "note": None}


def test_empty_keyword_arguments_stay_as_they_are_beside_sealed_arguments_and_a_result_is_sealed_once():
    job = tasks_encrypted.echo.using(idempotency_key="echo-k").enqueue("ref-5")
    row = stored(job.pk, "args", "kwargs")
    assert_sealed(row["args"])  # how a row says it is encrypted: its arguments always are
    assert row["kwargs"] == {}  # nothing to hide: not sealed, nor opened by the worker
    drain()
    assert Job.objects.get(pk=job.pk).wait(timeout=5) == "ref-5"
    result = stored(job.pk, "result")["result"]
    assert_sealed(result)
    key = IdempotencyKey.objects.get(job_id=job.pk)
    # The key stores the job's own ciphertext: the result was sealed once, not once per copy.
    assert raw_row("jobguard_idempotencykey", key.pk, "result")["result"] == result


def test_the_stored_json_text_of_a_sealed_value_is_what_json_dumps_writes_and_opens_to_the_value():
    value = [7, "ünïcode", {"card": "4242"}]
    text = seal_json_text(value, ARGS)
    sealed = json.loads(text)
    assert_sealed(sealed)
    assert text == json.dumps(sealed)
    assert open_json(sealed, ARGS, "job.args") == value
    assert seal_json_text(sealed, ARGS) == text  # a value sealed already is kept, not sealed again
    assert open_json(json.loads(seal_json_text(value, ARGS, json.dumps(value))), ARGS, "a") == value
    with pytest.raises(DecryptionError, match="authentication tag does not match") as refused:
        open_json(sealed, KWARGS, "job.kwargs")
    assert refused.value.reason == "tampered"  # another kind of field: the label is authenticated


def test_a_task_that_no_longer_encrypts_still_reads_its_sealed_rows():
    job = tasks_encrypted.stash.enqueue("ref-4")
    # The same row, now the job of a task without encrypt=True (switched off since).
    Job.objects.filter(pk=job.pk).update(task_name=tasks_encrypted.stash_plain.name)
    drain()
    assert Job.objects.get(pk=job.pk).wait(timeout=5) == {"reference": "ref-4", "note": None}
    # Its outputs are kept as sealed as its arguments were.
    assert_sealed(stored(job.pk, "result")["result"])


def test_rotation_reads_rows_of_the_older_key_and_writes_with_the_newest():
    job = tasks_encrypted.stash.enqueue("ref-5")
    with keys(NEW_KEY, SUITE_KEY):
        drain()
        assert Job.objects.get(pk=job.pk).wait(timeout=5) == {"reference": "ref-5", "note": None}
    row = stored(job.pk, "args", "result")
    assert_sealed(row["args"], "test1")
    assert_sealed(row["result"], "new1")


def test_the_size_limit_applies_to_the_clear_value():
    value = "x" * 900
    with _jobguard(MAX_PAYLOAD_BYTES=1000):
        job = tasks_encrypted.echo.enqueue(value)  # its ciphertext is larger than 1000 bytes
        assert len(str(stored(job.pk, "args")["args"])) > 1000
        with pytest.raises(PayloadTooLargeError):
            tasks_encrypted.echo.enqueue("x" * 1100)


def test_a_task_that_encrypts_is_refused_without_a_key_naming_the_task():
    with (
        keys(),
        pytest.raises(ImproperlyConfigured, match=r"tests\.encrypted\.echo stores its data encrypted"),
    ):
        tasks_encrypted.echo.enqueue("secret")
    assert not Job.objects.exists()


def test_all_tasks_encrypts_tasks_without_the_option():
    with _jobguard(ENCRYPTION={"ALL_TASKS": True}):
        job = tasks.add.enqueue(1, b=2)
        assert_sealed(stored(job.pk, "args")["args"])
        drain()
        assert Job.objects.get(pk=job.pk).wait(timeout=5) == 3
        assert is_encrypted(stored(job.pk, "result")["result"])


def _jobguard(**changes: object) -> override_settings:
    return override_settings(JOBGUARD={**settings.JOBGUARD, **changes})


@override_settings(JOBGUARD={**settings.JOBGUARD, "STORE": "memory"})
def test_the_memory_store_keeps_values_in_clear_behind_the_same_api():
    memory = store.memory_store()
    assert memory is not None
    memory.clear()
    with keys():  # no key needed: nothing is sealed there
        job = tasks_encrypted.stash.enqueue("mem-1", mode="retry_once")
        assert_enqueued(tasks_encrypted.stash, args=["mem-1"])
        with frozen_time() as clock:
            run_jobs()
            clock.advance(datetime.timedelta(minutes=5))
            summary = run_jobs()
    assert [(j.pk, j.status, j.result) for j in summary.jobs] == [
        (job.pk, "succeeded", {"reference": "mem-1", "note": None})
    ]
    (stored_job,) = memory.jobs.values()
    assert stored_job.checkpoints == {"seen": {"reference": "mem-1"}}


def test_a_schedule_of_an_encrypting_task_keeps_its_arguments_sealed_and_enqueues_them():
    declared = {
        "echo-nightly": {"task": tasks_encrypted.echo.name, "cron": "0 3 * * *", "args": ["sched-secret"]}
    }
    with _jobguard(SCHEDULES=declared):
        schedules.sync()
        row = Schedule.objects.get(name="echo-nightly")
        first = raw_row("jobguard_schedule", row.pk, "args", "kwargs")
        assert_sealed(first["args"])
        schedules.sync()  # the same definition: compared in clear, not written again
        assert raw_row("jobguard_schedule", row.pk, "args")["args"] == first["args"]
        job = schedules.run_now(row, user=make_user("sam", "run_schedule"))
    assert_sealed(stored(job.pk, "args")["args"])
    drain()
    assert Job.objects.get(pk=job.pk).wait(timeout=5) == "sched-secret"
