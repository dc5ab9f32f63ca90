"""Structured fields for job log records.

Every record about a job carries the same ``extra=`` fields so a JSON formatter (see the
example project) turns them into searchable keys: ``job_id``, ``job_type`` (the task),
``queue``, ``attempt``, ``idempotency_key``, ``lock_key`` / ``resource_id``, ``worker_id``,
``duration`` (seconds the handler ran, when it ran) and ``outcome``. Every key is always
present, None where it does not apply, so formatters and log queries need no special cases.

For plain text logs, :class:`TextFormatter` keeps every record on one line.
"""

from __future__ import annotations

import logging
import re
import sys
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from ._redact import payload_secrets, redact

__all__ = [
    "JOB_LOG_FIELDS",
    "OUTCOMES",
    "TextFormatter",
    "escape_controls",
    "job_fields",
    "log_job_exception",
    "set_trace_fields",
]

JOB_LOG_FIELDS = (
    "job_id",
    "job_type",
    "queue",
    "attempt",
    "idempotency_key",
    "lock_key",
    "resource_id",
    "worker_id",
    "duration",
    "outcome",
)


#: Values of ``outcome``: how the attempt (or the event the record reports) ended.
OUTCOMES = (
    "succeeded",
    "retry",
    "dead",
    "duplicate",
    "lock_contended",
    "lock_unavailable",
    "lock_lost",
    "lease_lost",
    "stale",
    "reappeared",
    "handed_back",
    "abandoned",
    "db_error",
    "crashed",
    "statement_lost",
)


#: ``trace_id`` and ``span_id`` of the current span, when tracing is on (see set_trace_fields).
_trace_fields: Callable[[], dict[str, Any]] | None = None


def set_trace_fields(source: Callable[[], dict[str, Any]] | None) -> None:
    """Add what ``source`` returns (``trace_id``, ``span_id``) to every job record; None stops it.

    Set by the app when ``JOBGUARD["OPENTELEMETRY"]`` is on, so log lines join their trace.
    """
    global _trace_fields
    _trace_fields = source


class _JobLike(Protocol):
    id: int
    task_name: str
    queue_name: str
    attempts: int
    idempotency_key: str | None
    lock_key: str
    args: Any
    kwargs: Any


def job_fields(job: _JobLike, worker_id: str = "", **more: Any) -> dict[str, Any]:
    """The ``extra=`` dict for a log record about ``job``; ``more`` sets duration, outcome...

    Keys are made from the payload, so values under ``JOBGUARD["REDACT"]`` names are replaced
    in them; a message that names a key takes it from here (``fields["lock_key"]``).
    """
    idempotency_key, lock_key = job.idempotency_key, job.lock_key or None
    if idempotency_key or lock_key:
        secrets = payload_secrets(job)
        if secrets:
            idempotency_key = idempotency_key and redact(idempotency_key, secrets)
            lock_key = lock_key and redact(lock_key, secrets)
    fields: dict[str, Any] = {
        "job_id": job.id,
        "job_type": job.task_name,
        "queue": job.queue_name,
        "attempt": job.attempts,
        "idempotency_key": idempotency_key,
        "lock_key": lock_key,
        # The resource a lock key guards ("order:123"), for dashboards that group by it.
        "resource_id": lock_key,
        "worker_id": worker_id,
        "duration": None,
        "outcome": None,
    }
    if _trace_fields is not None:
        fields.update(_trace_fields())
    fields.update(more)
    return fields


def log_job_exception(
    logger: logging.Logger, level: int, msg: str, *args: Any, job: _JobLike, worker_id: str = "", **more: Any
) -> None:
    """Log ``msg`` about ``job`` with the exception being handled, its traceback redacted.

    A traceback quotes the handler's input as often as an error message does, so under
    ``JOBGUARD["REDACT"]`` the record carries the redacted text as its ``exc_text`` and no
    ``exc_info``: formatters, JSON ones included, print ``exc_text`` and never format the
    exception again from the original. Call from an ``except`` block.
    """
    if not logger.isEnabledFor(level):
        return
    fields = job_fields(job, worker_id, **more)
    secrets = payload_secrets(job)
    if not secrets:
        logger.log(level, msg, *args, exc_info=True, extra=fields, stacklevel=2)
        return
    path, line, function, _ = logger.findCaller(stacklevel=2)
    record = logger.makeRecord(logger.name, level, path, line, msg, args, None, function, fields)
    record.exc_text = redact("".join(traceback.format_exception(*sys.exc_info())).rstrip("\n"), secrets)
    logger.handle(record)


# C0 and C1 control characters, DEL, and the separators some log viewers break lines at.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED_ESCAPES.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def escape_controls(text: str) -> str:
    """``text`` on one line: line breaks and other control characters written as escapes."""
    return _CONTROLS.sub(_escape, text)


class TextFormatter(logging.Formatter):
    """A :class:`logging.Formatter` that writes each record on exactly one line.

    Task names, keys and error messages come from users (an API caller, a payload), and a
    newline in one of them would start a line that reads as a record of its own; an ANSI
    escape could rewrite the terminal. Everything the record formats to (message, fields,
    traceback) has its control characters escaped (``\\n``, ``\\r``, ``\\x1b``), so a traceback
    is one line too. Takes the arguments of :class:`logging.Formatter`.
    """

    def format(self, record: logging.LogRecord) -> str:
        return escape_controls(super().format(record))
