"""JOBGUARD["REDACT"]: which payload values are secret, and how error text loses them."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from django.test import override_settings

from django_jobguard._redact import payload_secrets, redact
from django_jobguard.log import job_fields

CARD = "4111 1111 1111 1111"


def job(task_name: str = "shop.tasks.charge", args=(), kwargs=None, **fields):
    base = {"id": 1, "queue_name": "default", "attempts": 1, "idempotency_key": None, "lock_key": ""}
    return SimpleNamespace(task_name=task_name, args=list(args), kwargs=kwargs or {}, **{**base, **fields})


@override_settings(JOBGUARD={"REDACT": ["card_number", "CVV"]})
def test_values_under_a_redacted_name_at_any_depth_are_secret_longest_first():
    payload = {
        "order_id": 7,
        "CVV": 123,
        "customer": {"cards": [{"Card_Number": CARD, "label": "work"}]},
        "card_number": {"primary": "4000 0000 0000 0002", "spare": None, "valid": True},
    }
    assert payload_secrets(job(kwargs=payload)) == (CARD, "4000 0000 0000 0002", "123")


@override_settings(JOBGUARD={"REDACT": ["cvv"]})
def test_a_positional_argument_is_secret_by_the_parameter_it_binds_to():
    # tests.testapp.tasks.add(a, b=0): REDACT names "b" here only to have a registered task.
    with override_settings(JOBGUARD={"REDACT": ["b"]}):
        assert payload_secrets(job("tests.testapp.tasks.add", args=[1, 2024])) == ("2024",)
    # Dicts inside positional arguments are searched too, whatever the task.
    assert payload_secrets(job("not.registered", args=[{"cvv": "987"}])) == ("987",)


def test_nothing_is_secret_without_the_setting():
    assert payload_secrets(job(kwargs={"card_number": CARD})) == ()


def test_redact_replaces_every_occurrence():
    text = f"ValueError: card {CARD} declined\n  card_number={CARD!r}"
    assert redact(text, (CARD,)) == "ValueError: card [redacted] declined\n  card_number='[redacted]'"


@override_settings(JOBGUARD={"REDACT": ["card_number"]})
def test_log_fields_carry_keys_without_the_secret():
    fields = job_fields(
        job(kwargs={"card_number": CARD}, idempotency_key=f"charge:{CARD}", lock_key=f"card:{CARD}")
    )
    assert (fields["idempotency_key"], fields["lock_key"], fields["resource_id"]) == (
        "charge:[redacted]",
        "card:[redacted]",
        "card:[redacted]",
    )


@pytest.mark.parametrize("value", [None, True, False, ""])
@override_settings(JOBGUARD={"REDACT": ["flag"]})
def test_values_that_read_as_common_words_are_not_secrets(value):
    assert payload_secrets(job(kwargs={"flag": value})) == ()


def crash_log(logger, card_job, **settings) -> list:
    """The records of one ``log_job_exception`` call made while handling an error that quotes the card."""
    from django_jobguard.log import log_job_exception

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep()
    logger.addHandler(handler)
    try:
        with override_settings(JOBGUARD=settings):
            try:
                raise ValueError(f"declined: {CARD}")
            except ValueError:
                log_job_exception(
                    logger, logging.ERROR, "job_crashed job_id=%s", 1, job=card_job, outcome="crashed"
                )
    finally:
        logger.removeHandler(handler)
    return records


@pytest.mark.parametrize("formatter", ["text", "json", "one line"])
def test_a_logged_traceback_loses_the_secret_in_every_formatter(formatter):
    from pythonjsonlogger.json import JsonFormatter

    from django_jobguard.log import TextFormatter

    logger = logging.getLogger("tests.redact.crash")
    logger.setLevel(logging.INFO)
    [record] = crash_log(logger, job(kwargs={"card_number": CARD}), REDACT=["card_number"])
    shown = {"text": logging.Formatter(), "json": JsonFormatter(), "one line": TextFormatter()}[formatter]
    text = shown.format(record)
    assert CARD not in text
    assert "ValueError: declined: [redacted]" in text.replace("\\n", "\n")
    assert record.outcome == "crashed" and record.funcName == "crash_log"


def test_without_the_setting_the_record_keeps_the_exception_itself():
    logger = logging.getLogger("tests.redact.crash")
    logger.setLevel(logging.INFO)
    [record] = crash_log(logger, job(kwargs={"card_number": CARD}))
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert CARD in logging.Formatter().format(record)
