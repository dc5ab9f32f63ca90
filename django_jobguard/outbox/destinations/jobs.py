"""The "jobs" destination: a message becomes a job in ``JOBGUARD["DATABASE_ALIAS"]``, exactly once.

The bridge to a jobs database of its own. :func:`django_jobguard.outbox.enqueue_via_outbox`
writes the call (task, arguments, options) as an outbox message in the application's
transaction, on ``OUTBOX["DATABASE_ALIAS"]``; the relay hands it here, and :meth:`send`
enqueues the job on the jobs' alias under an idempotency key made from the message id
(``outbox:<message id>``), unless the call carries a key of its own (``using(idempotency_key=...)``
or the task's ``idempotency_key`` template). A relay killed between the enqueue's commit and
its record sends the message again, with the same id: the key gives back the job the first
send made, so the message makes one job however often it is sent.

What :meth:`send` answers the relay:

- the job is stored (or was already): delivered;
- the jobs database cannot be reached or fails the statement: :class:`TransientDeliveryError`
  (the destination's ``RETRY`` backoff, then another try);
- the call can no longer be enqueued (its task is not registered any more, its arguments no
  longer bind the task's signature, its key names another call's job, its queue is refused):
  :class:`PermanentDeliveryError` with the reason, so the message is dead with it, for an
  operator to read, fix and replay or skip.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import DatabaseError, InterfaceError, connections

from ...conf import get_settings
from ...exceptions import JobguardError
from ...registry import registry
from ._options import Options
from .base import Envelope, PermanentDeliveryError, TransientDeliveryError

if TYPE_CHECKING:
    from ...models import Job
    from ...task import Task

logger = logging.getLogger("django_jobguard.outbox")

__all__ = ["CALL_FIELD", "JobsDestination", "call_payload", "key_for"]

#: The associated data a sealed call is encrypted under (see :mod:`django_jobguard.encryption`).
CALL_FIELD = "outbox.job_call"
#: The idempotency key of a job enqueued from message ``id`` when its call names none.
KEY_TEMPLATE = "outbox:{id}"
# The payload's keys: the task, its arguments (or, sealed, both), and using()'s options.
_KEYS = frozenset(
    {"task", "args", "kwargs", "sealed", "queue_name", "priority", "run_after", "run_after_seconds", "key"}
)


def call_payload(task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The message payload of ``task(*args, **kwargs)``: the task's name, its arguments and the
    options ``task`` carries beyond the registered task's (``using(...)``'s).

    The arguments are sealed when the task encrypts its data (``@task(encrypt=True)`` or
    ``ENCRYPTION["ALL_TASKS"]``), so the outbox table holds no more in clear than the job would.
    """
    declared = registry.find(task.name)
    payload: dict[str, Any] = {"task": task.name}
    conf = get_settings()
    if task.encrypt or conf.encryption.all_tasks:
        from ...encryption import encrypt_json

        payload["sealed"] = encrypt_json({"args": list(args), "kwargs": dict(kwargs)}, field=CALL_FIELD)
    else:
        payload["args"] = list(args)
        payload["kwargs"] = dict(kwargs)
    if declared is not None and task.queue_name != declared.queue_name and task.queue_name:
        payload["queue_name"] = task.queue_name
    if declared is not None and task.priority != declared.priority:
        payload["priority"] = task.priority
    if isinstance(task.run_after, datetime.timedelta):
        payload["run_after_seconds"] = task.run_after.total_seconds()
    elif isinstance(task.run_after, datetime.datetime):
        payload["run_after"] = task.run_after.isoformat()
    if task.idempotency_key is not None:
        payload["key"] = task.idempotency_key
    return payload


def key_for(message_id: str) -> str:
    """The idempotency key of the job made from message ``message_id`` (a call that names no key)."""
    return KEY_TEMPLATE.format(id=message_id)


def _call(envelope: Envelope) -> tuple[Task[Any, Any], list[Any], dict[str, Any]]:
    """The task, with its options, and the arguments ``envelope`` asks for; PermanentDeliveryError
    naming what does not match any more."""
    payload = envelope.payload
    where = f"message {envelope.id}"
    if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
        raise PermanentDeliveryError(
            f"{where}: the payload is not a job call (an object with a 'task' name); "
            "publish to a jobs destination through enqueue_via_outbox()"
        )
    unknown = sorted(set(payload) - _KEYS)
    if unknown:
        raise PermanentDeliveryError(f"{where}: unknown payload keys {unknown}")
    task = registry.find(payload["task"])
    if task is None:
        raise PermanentDeliveryError(
            f"{where}: task {payload['task']!r} is not registered in this worker (renamed or removed "
            "since the message was published?)"
        )
    if "sealed" in payload:
        from ...encryption import DecryptionError, decrypt_json

        try:
            call = decrypt_json(payload["sealed"], field=CALL_FIELD)
        except DecryptionError as exc:
            # Another worker may hold the key (a rolling deploy of a new key): try again later.
            raise TransientDeliveryError(
                f"{where}: the sealed arguments cannot be opened here: {exc}"
            ) from None
        args, kwargs = call.get("args"), call.get("kwargs")
    else:
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise PermanentDeliveryError(f"{where}: 'args' must be a list and 'kwargs' an object")
    run_after: datetime.datetime | None = None
    try:
        if "run_after_seconds" in payload:
            # From the publish (the publishing transaction's database time), not from this send:
            # a message sent again asks for the same time, so its key meets the same job.
            run_after = envelope.published_at + datetime.timedelta(
                seconds=float(payload["run_after_seconds"])
            )
        elif "run_after" in payload:
            run_after = datetime.datetime.fromisoformat(payload["run_after"])
        task = task.using(
            queue_name=payload.get("queue_name"),
            priority=payload.get("priority"),
            run_after=run_after,
            idempotency_key=payload.get("key") or _own_key(task, envelope.id),
        )
    except (JobguardError, TypeError, ValueError, OverflowError) as exc:
        raise PermanentDeliveryError(f"{where}: {exc}") from None
    return task, args, kwargs


def _own_key(task: Task[Any, Any], message_id: str) -> str | None:
    # A task that derives its key from its arguments keeps it: that key names the business
    # action for every enqueue of it, and dedupes a message sent twice as well as the id would.
    return None if task.idempotency_key_template is not None else key_for(message_id)


class JobsDestination:
    """Enqueues each message's call as a job on ``JOBGUARD["DATABASE_ALIAS"]`` (no options)."""

    backend: ClassVar[str] = "jobs"

    def __init__(self, name: str) -> None:
        self.name = name
        self._aliases: set[str] = set()

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> JobsDestination:
        Options(name, options, frozenset())
        return cls(name)

    def send(self, envelope: Envelope) -> None:
        task, args, kwargs = _call(envelope)
        alias = get_settings().database_alias
        self._aliases.add(alias)
        try:
            job = self.enqueue(task, args, kwargs)
        except (DatabaseError, InterfaceError) as exc:
            # The connection may be broken: the next attempt opens a fresh one.
            connections[alias].close()
            raise TransientDeliveryError(f"the jobs database ({alias!r}) failed: {exc}") from exc
        except JobguardError as exc:
            # Arguments that no longer bind, a refused queue, a key that names another call's job.
            raise PermanentDeliveryError(f"message {envelope.id}: {type(exc).__name__}: {exc}") from None
        logger.debug(
            "outbox_job_enqueued destination=%s message_id=%s job_id=%s task=%s",
            self.name,
            envelope.id,
            job.pk,
            job.task_name,
        )

    def enqueue(self, task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any]) -> Job:
        """Store the job (or find the one its key names); its own transaction on the jobs' alias."""
        return task.enqueue(*args, **kwargs)

    def close(self) -> None:
        # The delivery thread's connection to the jobs database ends with it (not one the caller
        # holds a transaction on: drain() delivers in the calling thread).
        for alias in self._aliases:
            if alias != get_settings().outbox_alias and not connections[alias].in_atomic_block:
                connections[alias].close()
        self._aliases.clear()
