"""``enqueue_via_outbox()``: an enqueue in the application's transaction, the jobs in a database of their own.

An enqueue joins the caller's transaction only on ``JOBGUARD["DATABASE_ALIAS"]``. With the jobs
in a database of their own, :func:`enqueue_via_outbox` writes the call as an outbox message on
``OUTBOX["DATABASE_ALIAS"]`` (the application's database) instead, inside the caller's
transaction there: a rollback leaves no message, a commit leaves one, and the relay turns it into
the job, exactly once (:mod:`.destinations.jobs`).

Everything :meth:`Task.enqueue` would refuse before writing is refused here, before anything is
written, so a bad call fails in the request that made it, not later in the relay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._json import validate_payload
from ..conf import get_settings
from ..exceptions import InvalidPublishError, UnknownDestinationError, UnknownTaskError
from ..registry import registry
from ..task import Task
from .destinations.jobs import JobsDestination, call_payload
from .loading import backend_class
from .publisher import publish

if TYPE_CHECKING:
    from ..models import OutboxMessage

__all__ = ["enqueue_via_outbox", "jobs_destination"]


def jobs_destination() -> str:
    """The name of the one declared destination whose backend is "jobs" (or a subclass of it)."""
    names = []
    for name, config in sorted(get_settings().outbox.destinations.items()):
        try:
            cls = backend_class(config)
        except ValueError:
            continue  # reported by the system check (jobguard.E060)
        if isinstance(cls, type) and issubclass(cls, JobsDestination):
            names.append(name)
    if len(names) != 1:
        found = f"{len(names)}: {', '.join(names)}" if names else "none"
        raise UnknownDestinationError(
            "enqueue_via_outbox() needs exactly one destination with BACKEND 'jobs' in "
            f"JOBGUARD['OUTBOX']['DESTINATIONS'] ({found} declared), e.g. "
            "{'jobs': {'BACKEND': 'jobs'}}."
        )
    return names[0]


def _check(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The call's arguments, cleaned, once everything an enqueue checks before writing passed."""
    if not isinstance(task, Task):
        raise InvalidPublishError(f"enqueue_via_outbox() takes a task (made with @task), not {task!r}.")
    declared = registry.find(task.name)
    if declared is None or declared.func is not task.func:
        raise UnknownTaskError(
            f"No task is registered as {task.name!r} in this process: the relay's worker could not "
            "run its job. Declare it with @task in a module the app loads (tasks.py)."
        )
    if task.after:
        raise InvalidPublishError(
            "enqueue_via_outbox() does not take using(after=...): the jobs it would wait for live in "
            "the jobs database, and the call's job does not exist until the relay enqueues it."
        )
    bound = task.bind(args, kwargs)
    clean_args, clean_kwargs = validate_payload(args, kwargs)
    conf = get_settings()
    refusal = conf.undeclared_queue(task.queue_name or conf.default_queue)
    if refusal is not None:
        from ..exceptions import UnknownQueueError

        raise UnknownQueueError(f"{task.name}: {refusal}")
    # Their templates format from the arguments: a key that cannot be made fails here, not in the relay.
    task.lock_key_for(bound)
    task.idempotency_key_for(bound)
    task.flow_keys_for(bound)
    return list(clean_args), dict(clean_kwargs)


def enqueue_via_outbox(task: Task[Any, Any], /, *args: Any, **kwargs: Any) -> OutboxMessage:
    """Enqueue ``task(*args, **kwargs)`` through the outbox: in the caller's transaction on the
    application's database, as a message the relay turns into the job, exactly once.

    Call it as ``enqueue_via_outbox(send_receipt, order_id=7)``; per-call options ride on the
    task as for an enqueue: ``enqueue_via_outbox(send_receipt.using(priority=10), order_id=7)``
    (``queue_name``, ``priority``, ``run_after``, ``idempotency_key``; not ``after``). Returns
    the stored :class:`~django_jobguard.models.OutboxMessage`. The job's idempotency key is
    ``outbox:<message_id>`` unless the call names one (``using(idempotency_key=...)``, the
    task's template): that key is the job's, and dedupes the message sent twice all the same.

    Raises what ``task.enqueue()`` would before writing (arguments that do not bind or are not
    JSON, a refused queue, a key template that cannot be formatted), :class:`UnknownTaskError`
    for a task not registered here, and :class:`UnknownDestinationError` unless exactly one
    destination with ``BACKEND`` "jobs" is declared. Nothing is written on any error.
    """
    clean_args, clean_kwargs = _check(task, args, kwargs)
    return publish(jobs_destination(), call_payload(task, clean_args, clean_kwargs))
