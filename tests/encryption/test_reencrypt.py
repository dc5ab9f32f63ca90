"""manage.py jobguard_reencrypt: every stored ciphertext moves to the current key, nothing is lost.

The rows are written as the write paths store them (each field sealed as
django_jobguard.encryption.fields lists it); the command is run in this process, in a
subprocess killed halfway, and while a real worker process runs encrypted jobs.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_jobguard.encryption import JSON_MARKER, DecryptionError
from django_jobguard.encryption.fields import ENCRYPTED_FIELDS, EncryptedField
from django_jobguard.encryption.rotation import reencrypt
from django_jobguard.models import DeadLetter, IdempotencyKey, Job, ReplayEvent, Schedule, Workflow
from tests.conftest import ROOT, wait_for, worker_env
from tests.support.rotation import K1, K2, K3, keys_restored, set_keys

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _keys() -> Iterator[None]:
    with keys_restored():
        set_keys(K1)
        yield


def _field(model: str, name: str) -> EncryptedField:
    return next(f for f in ENCRYPTED_FIELDS if f.model_name == model and f.field == name)


def _seal(model: str, name: str, value: Any) -> Any:
    return _field(model, name).encrypt(value)


def _clear_values(n: int) -> dict[tuple[str, str], Any]:
    """One clear value per encrypted field, marked with ``n``."""
    return {
        ("Job", "args"): [f"card-{n}", n],
        ("Job", "kwargs"): {"address": f"street {n}"},
        ("Job", "result"): {"charged": n},
        ("Job", "last_error"): f"declined card-{n}",
        ("Job", "progress"): {"done": 1, "total": 2, "message": f"card-{n}", "at": "2025-01-01T00:00:00Z"},
        ("Job", "checkpoints"): {"page": n, "cursor": f"card-{n}"},
        ("Job", "attempt_history"): [
            {"worker_id": "w", "error_class": "ValueError", "error": f"bad {n}", "traceback": f"tb {n}"},
            {"worker_id": "w", "started_at": "2025-01-01T00:00:00Z"},
        ],
        ("DeadLetter", "args"): [f"card-{n}"],
        ("DeadLetter", "kwargs"): {"n": n},
        ("DeadLetter", "error_message"): f"declined {n}",
        ("DeadLetter", "traceback"): f"Traceback {n}",
        ("DeadLetter", "replay_args"): [f"fixed-{n}"],
        ("DeadLetter", "replay_kwargs"): {"fixed": n},
        ("ReplayEvent", "data"): {"args": [f"fixed-{n}"], "kwargs": {"fixed": n}, "job_id": n},
        ("IdempotencyKey", "result"): {"charged": n},
        ("Schedule", "args"): [f"card-{n}"],
        ("Schedule", "kwargs"): {"n": n},
        ("Workflow", "callbacks"): {
            "success": {"fields": {"task_name": "tests.notify", "args": [f"card-{n}"], "kwargs": {}}},
            "dead": {"fields": {"task_name": "tests.alert", "args": [], "kwargs": {"n": n}}, "result_as": ""},
        },
    }


def _sealed(n: int) -> dict[tuple[str, str], Any]:
    return {(model, name): _seal(model, name, value) for (model, name), value in _clear_values(n).items()}


def make_rows(n: int) -> dict[str, Any]:
    """One row of each table with every encrypted field sealed under the current key."""
    sealed = _sealed(n)

    def of(model: str) -> dict[str, Any]:
        return {name: value for (m, name), value in sealed.items() if m == model}

    job = Job.objects.create(task_name="tests.charge", status="dead", **of("Job"))
    now = timezone.now()
    letter = DeadLetter.objects.create(
        job=job,
        task_name="tests.charge",
        queue_name="default",
        attempts=1,
        max_attempts=1,
        reason="permanent_error",
        category="permanent",
        first_failed_at=now,
        last_failed_at=now,
        **of("DeadLetter"),
    )
    event = ReplayEvent.objects.create(dead_letter=letter, action="requested", **of("ReplayEvent"))
    key = IdempotencyKey.objects.create(
        key=f"h:{n}",
        scope="tests.charge",
        fingerprint="f",
        expires_at=now + datetime.timedelta(days=1),
        **of("IdempotencyKey"),
    )
    schedule = Schedule.objects.create(
        name=f"s{n}", task_name="tests.charge", cron="* * * * *", **of("Schedule")
    )
    workflow = Workflow.objects.create(kind="batch", **of("Workflow"))
    return {
        "Workflow": workflow.pk,
        "Job": job.pk,
        "DeadLetter": letter.pk,
        "ReplayEvent": event.pk,
        "IdempotencyKey": key.pk,
        "Schedule": schedule.pk,
    }


def stored(model: str, pk: Any, name: str) -> Any:
    return _field(model, name).model.objects.values_list(name, flat=True).get(pk=pk)


def key_ids(model: str, pk: Any, name: str) -> list[str]:
    return _field(model, name).key_ids(stored(model, pk, name))


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("jobguard_reencrypt", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_every_field_of_every_table_moves_to_the_current_key_and_reads_the_same():
    rows = [make_rows(n) for n in range(3)]
    assert key_ids("Job", rows[0]["Job"], "attempt_history") == ["k1", "k1"]
    set_keys(K2, K1)

    out, _ = run("--batch-size", "2")

    for field in ENCRYPTED_FIELDS:
        assert f"{field.name}: re-encrypted 3" in out, field.name
    for n, pks in enumerate(rows):
        for field in ENCRYPTED_FIELDS:
            value = stored(field.model_name, pks[field.model_name], field.field)
            assert field.key_ids(value) and set(field.key_ids(value)) == {"k2"}, field.name
            assert field.decrypt(value) == _clear_values(n)[field.model_name, field.field], field.name
    # Nothing is left: a second run finds nothing, and k1 can go.
    assert "Re-encrypted 0 value(s) in total." in run()[0]
    set_keys(K2)
    for field in ENCRYPTED_FIELDS:
        field.decrypt(stored(field.model_name, rows[0][field.model_name], field.field))


def test_clear_values_and_values_under_the_current_key_are_left_alone():
    set_keys(K2, K1)
    current = make_rows(1)  # already under k2
    clear = Job.objects.create(
        task_name="tests.plain", args=["jg1:not-a-token", 1], last_error="see jg1:k1:abc"
    )
    before = {
        f.field: stored("Job", current["Job"], f.field) for f in ENCRYPTED_FIELDS if f.model_name == "Job"
    }

    out, _ = run()

    assert "Re-encrypted 0 value(s) in total." in out
    assert {f: stored("Job", current["Job"], f) for f in before} == before  # not even re-sealed
    assert stored("Job", clear.pk, "args") == ["jg1:not-a-token", 1]
    assert stored("Job", clear.pk, "last_error") == "see jg1:k1:abc"


def test_a_dry_run_counts_and_writes_nothing():
    pks = make_rows(1)
    set_keys(K2, K1)
    before = stored("Job", pks["Job"], "args")

    out, _ = run("--dry-run")

    assert "jobguard_job.args: would re-encrypt 1" in out
    assert f"Would re-encrypt {len(ENCRYPTED_FIELDS)} value(s) in total." in out
    assert stored("Job", pks["Job"], "args") == before


def test_a_value_under_a_missing_key_or_altered_fails_the_run_by_name_and_the_rest_is_done():
    lost = make_rows(1)
    set_keys(K3)  # a key since removed from the settings
    unknown = make_rows(2)
    set_keys(K2, K1)
    token = stored("Job", lost["Job"], "result")[JSON_MARKER]
    tampered = token[:-6] + ("AAAAAA" if not token.endswith("AAAAAA") else "BBBBBB")
    Job.objects.filter(pk=lost["Job"]).update(result={JSON_MARKER: tampered})

    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match="could not be decrypted"):
        call_command("jobguard_reencrypt", stdout=out, stderr=err)
    errors = err.getvalue()

    assert f"Cannot decrypt jobguard_job pk={lost['Job']} result: key 'k1', tampered" in errors
    assert f"Cannot decrypt jobguard_job pk={unknown['Job']} args: key 'k3', missing key" in errors
    assert f"jobguard_schedule pk={unknown['Schedule']} kwargs: key 'k3'" in errors
    # The altered value and the unknown key's are left as they were; the rest moved.
    assert stored("Job", lost["Job"], "result") == {JSON_MARKER: tampered}
    assert key_ids("Job", unknown["Job"], "args") == ["k3"]
    assert key_ids("Job", lost["Job"], "args") == ["k2"]
    assert key_ids("Job", lost["Job"], "attempt_history") == ["k2", "k2"]
    with pytest.raises(DecryptionError):
        _field("Job", "result").decrypt(stored("Job", lost["Job"], "result"))


def test_a_concurrent_write_between_read_and_write_wins_and_the_row_is_read_again(monkeypatch):
    pks = make_rows(1)
    set_keys(K2, K1)
    original = EncryptedField.reencrypt
    written: list[Any] = []

    def reencrypt_while_a_worker_writes(self: EncryptedField, value: Any, keep: Any) -> Any:
        sealed = original(self, value, keep)
        if self.model_name == "Job" and self.field == "result" and not written:
            # A worker stores the job's new result (under the current key) after the command
            # read the row and before it writes: the command's write must not undo it.
            worker_value = self.encrypt({"charged": "by the worker"})
            Job.objects.filter(pk=pks["Job"]).update(result=worker_value)
            written.append(worker_value)
        return sealed

    monkeypatch.setattr(EncryptedField, "reencrypt", reencrypt_while_a_worker_writes)
    report = reencrypt("default", batch_size=10)

    assert stored("Job", pks["Job"], "result") == written[0]
    assert _field("Job", "result").decrypt(written[0]) == {"charged": "by the worker"}
    assert report.fields["jobguard_job.result"].reencrypted == 0 and report.complete
    assert report.fields["jobguard_job.args"].reencrypted == 1  # the row's other fields moved


def test_an_interrupted_run_continues_where_it_stopped(tmp_path):
    # Many small batches, slowed down: the process is killed after some have committed.
    for n in range(12):
        make_rows(n)
    sealed = _under("k1")
    set_keys(K2, K1)
    env = worker_env(JOBGUARD_ENCRYPTION_KEYS=f"{K2},{K1}")
    command = [sys.executable, "-m", "django", "jobguard_reencrypt", "--batch-size", "2", "--sleep", "0.5"]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _under("k2") >= 4, timeout=120, message="the first batches to commit")
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert 0 < _under("k1")  # stopped halfway

    resumed = subprocess.run(command[:-2], cwd=ROOT, env=env, capture_output=True, timeout=300, check=False)

    assert resumed.returncode == 0, resumed.stderr.decode()
    assert _under("k1") == 0
    assert _under("k2") == sealed


def _under(key_id: str) -> int:
    """Stored ciphertexts under ``key_id``, over every field of every row."""
    total = 0
    for field in ENCRYPTED_FIELDS:
        for value in field.model.objects.values_list(field.field, flat=True):
            total += sum(1 for k in field.key_ids(value) if k == key_id)
    return total


def test_the_command_refuses_to_run_without_a_key():
    set_keys()
    with pytest.raises(CommandError, match="No encryption key is configured"):
        run()
