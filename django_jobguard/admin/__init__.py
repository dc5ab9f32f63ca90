"""Django admin for jobs, dead letters, idempotency keys and database locks.

Rows are read-only here: they change through the worker and the service layer. The one
thing operators do in the admin is the dead-letter replay workflow (request, approve,
reject), and those views call :mod:`django_jobguard.dlq`, which holds the rules.
Payloads, stored results and tracebacks show only to users with ``jobguard.view_payload``.
"""

from .dead_letters import DeadLetterAdmin
from .jobs import IdempotencyKeyAdmin, JobAdmin
from .locks import LockAdmin, LockReleaseAdmin
from .queues import QueueEventAdmin, QueueHealthAdmin
from .workers import WorkerAdmin

__all__ = [
    "DeadLetterAdmin",
    "IdempotencyKeyAdmin",
    "JobAdmin",
    "LockAdmin",
    "LockReleaseAdmin",
    "QueueEventAdmin",
    "QueueHealthAdmin",
    "WorkerAdmin",
]
