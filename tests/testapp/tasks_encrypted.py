"""Tasks of the encryption tests (tests/encryption): each puts its argument in every field it can.

``stash`` writes its reference into a checkpoint, a progress message, its error text (and so the
traceback and attempt history) and its result, so a test can look for it in every column.
"""

from __future__ import annotations

from typing import Any

from django_jobguard import PermanentError, TransientError, task
from django_jobguard.context import JobContext


def _stash(context: JobContext, reference: str, mode: str, note: dict[str, Any] | None) -> dict[str, Any]:
    context.checkpoint("seen", {"reference": reference})
    context.report_progress(1, 2, f"working on {reference}")
    if mode == "retry_once" and context.attempt == 1:
        raise TransientError(f"the first attempt of {reference} failed")
    if mode == "fail":
        raise PermanentError(f"cannot take {reference}")
    return {"reference": reference, "note": note}


@task(name="tests.encrypted.stash", encrypt=True, takes_context=True, max_attempts=3)
def stash(context: JobContext, reference: str, mode: str = "ok", note: dict[str, Any] | None = None) -> Any:
    return _stash(context, reference, mode, note)


@task(name="tests.encrypted.stash_plain", takes_context=True, max_attempts=3)
def stash_plain(
    context: JobContext, reference: str, mode: str = "ok", note: dict[str, Any] | None = None
) -> Any:
    """The same, stored in clear: the control that shows the dump would find a value."""
    return _stash(context, reference, mode, note)


@task(name="tests.encrypted.echo", encrypt=True)
def echo(value: Any) -> Any:
    return value
