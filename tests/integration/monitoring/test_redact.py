"""JOBGUARD["REDACT"] through a real worker: stored error text and log records lose the secret."""

from __future__ import annotations

import logging

import pytest
from django.test import override_settings

from django_jobguard import lock
from django_jobguard.models import DeadLetter, Job
from tests.support.dlq import run_burst
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

CARD = "4111 1111 1111 1111"


def redacting(*names: str):
    from django.conf import settings

    return override_settings(JOBGUARD={**settings.JOBGUARD, "REDACT": list(names)})


def stored_error_text(job: Job) -> list[str]:
    """Every place a failed job's error text is kept: the job, each attempt, its dead letter."""
    job.refresh_from_db()
    letter = DeadLetter.objects.get(job=job)
    texts = [job.last_error, letter.error_message, letter.traceback]
    for entry in job.attempt_history:
        texts += [entry["error"], entry["traceback"]]
    return texts


@pytest.mark.parametrize("how", ["nested keyword", "positional"])
def test_error_text_stored_for_jobs_attempts_and_dead_letters_loses_the_secret(how):
    # echoes_payload fails twice with ValueError(f"could not parse {blob}"), then is dead.
    with redacting("card_number", "blob" if how == "positional" else "cvv"):
        if how == "positional":
            job = tasks.echoes_payload.enqueue(CARD)
        else:
            job = tasks.echoes_payload.enqueue(blob={"customer": {"card_number": CARD}, "order": 7})
        run_burst()
    texts = stored_error_text(job)
    assert len(texts) == 7 and all(texts), texts
    assert not [text for text in texts if CARD in text]
    assert all("[redacted]" in text for text in texts)
    assert Job.objects.get(pk=job.pk).kwargs == job.kwargs  # the payload itself is kept as sent


def test_without_the_setting_the_error_text_keeps_what_the_handler_said():
    job = tasks.echoes_payload.enqueue(blob={"card_number": CARD})
    run_burst()
    assert all(CARD in text for text in stored_error_text(job))


def test_log_records_carry_keys_without_the_secret(caplog):
    caplog.set_level(logging.INFO, logger="django_jobguard")
    with redacting("resource"):
        held = lock(f"res:{CARD}", ttl=60)  # contended: the worker logs the job's lock key
        assert held.acquire(blocking=False)
        job = tasks.locked_interval.using(idempotency_key=f"pay:{CARD}").enqueue(CARD)
        run_burst()
        held.release()
    records = [r for r in caplog.records if getattr(r, "job_id", None) == job.pk]
    contended = [r for r in records if r.getMessage().startswith("lock_contended")]
    assert contended, [r.getMessage() for r in records]
    for record in records:
        assert CARD not in record.getMessage()
        assert (record.lock_key, record.resource_id, record.idempotency_key) == (
            "res:[redacted]",
            "res:[redacted]",
            "pay:[redacted]",
        )
    assert "lock_key='res:[redacted]'" in contended[0].getMessage()
    assert Job.objects.get(pk=job.pk).lock_key == f"res:{CARD}"  # stored as it is, to be locked by


def test_a_secret_at_the_cut_of_a_clipped_error_leaves_no_piece_behind():
    from django_jobguard._text import clip

    limit = 256
    message = "could not parse {}"
    # Pad the secret so that clipping the raw message would cut through the card number.
    pad = next(
        n
        for n in range(400)
        if CARD not in (cut := clip(message.format("x" * n + CARD + "y" * 400), limit)) and CARD[:9] in cut
    )
    with (
        redacting("blob"),
        override_settings(JOBGUARD={**_jobguard(), "REDACT": ["blob"], "MAX_ERROR_CHARS": limit}),
    ):
        job = tasks.echoes_payload.enqueue("x" * pad + CARD + "y" * 400)
        run_burst()
    texts = stored_error_text(job)
    assert len(texts) == 7 and all(texts)
    assert not [text for text in texts if CARD[:9] in text or CARD[-9:] in text], texts
    assert all(len(text) <= limit for text in texts)


def _jobguard() -> dict:
    from django.conf import settings

    return dict(settings.JOBGUARD)
