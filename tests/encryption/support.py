"""Helpers of the encryption tests: keys, settings that name them, what the database holds."""

from __future__ import annotations

import base64
import json
from typing import Any

from django.conf import settings
from django.db import connection
from django.test import override_settings

from django_jobguard.encryption import is_encrypted, key_id_of
from django_jobguard.models import Job

#: The suite's own key (tests/settings.py puts it in the environment), and two more.
SUITE_KEY = "test1:He6PP2eneiHvutGPst7EmMkJLhmitdYidp5RyKYzOt4"
OLD_KEY = "old1:" + base64.urlsafe_b64encode(bytes(range(32))).decode().rstrip("=")
NEW_KEY = "new1:" + base64.urlsafe_b64encode(bytes(range(32, 64))).decode().rstrip("=")


def keys(*entries: str) -> override_settings:
    """Settings whose ``JOBGUARD["ENCRYPTION"]["KEYS"]`` are ``entries`` (none: no key at all)."""
    group: dict[str, Any] = {"KEYS": list(entries)}
    if not entries:
        group["KEYS_ENV"] = "JOBGUARD_TEST_NO_SUCH_VARIABLE"
    return override_settings(JOBGUARD={**settings.JOBGUARD, "ENCRYPTION": group})


def stored(job_id: int, *columns: str) -> dict[str, Any]:
    """The columns of a job row as the database holds them (JSON parsed), not as a model opens them."""
    return raw_row("jobguard_job", job_id, *columns)


def raw_row(table: str, row_id: int, *columns: str) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE id = %s", [row_id])
        row = cursor.fetchone()
    assert row is not None, f"no row {row_id} in {table}"
    return {column: _parsed(value) for column, value in zip(columns, row, strict=True)}


def _parsed(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "[{":
        return json.loads(value)
    return value


def assert_sealed(value: Any, key_id: str = "test1") -> None:
    assert is_encrypted(value), f"stored in clear: {value!r}"
    assert key_id_of(value) == key_id


def write_raw_args(job: Job, args: Any) -> None:
    """Write a job's ``args`` column with raw SQL, as someone with database access would."""
    cast = "::jsonb" if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE jobguard_job SET args = %s{cast} WHERE id = %s", [json.dumps(args), job.pk])


def tampered(sealed: dict[str, str]) -> dict[str, str]:
    """``sealed`` (a JSON field's ciphertext) with one byte of its ciphertext changed."""
    ((marker, token),) = sealed.items()
    head, _, body = token.rpartition(":")
    raw = bytearray(base64.b64decode(body))
    raw[-20] ^= 0x01  # a byte of the ciphertext, before the tag
    return {marker: f"{head}:{base64.b64encode(bytes(raw)).decode()}"}


def drain(rounds: int = 20) -> None:
    """Run burst workers in this process until nothing is queued, retries made due at once."""
    from django.db.models.functions import Now

    from tests.support.dlq import run_burst

    for _ in range(rounds):
        Job.objects.filter(status="queued").update(run_after=Now())
        run_burst()
        if not Job.objects.filter(status__in=["queued", "running"]).exists():
            return
    raise AssertionError("jobs still queued after draining")


def drain_processes(workers: Any, *key_entries: str, rounds: int = 10) -> None:
    """Run ``jobguard_worker --burst`` processes with these keys until nothing is queued
    (a retry is made due at once: a burst exits before a backoff ends)."""
    from django.db.models.functions import Now

    env = {"JOBGUARD_ENCRYPTION_KEYS": ",".join(key_entries)}
    for _ in range(rounds):
        Job.objects.filter(status="queued").update(run_after=Now())
        done = workers.burst("--concurrency", "1", env=env)
        output = (done.stdout + done.stderr).decode(errors="replace")
        assert done.returncode == 0, output[-3000:]
        if not Job.objects.filter(status__in=["queued", "running"]).exists():
            return
    raise AssertionError("jobs still queued after draining")
