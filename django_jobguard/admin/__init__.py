"""Django admin for jobs, dead letters, idempotency keys, database locks and schedules.

Rows are read-only here: they change through the worker and the service layer. The one
thing operators do in the admin is the dead-letter replay workflow (request, approve,
reject), and those views call :mod:`django_jobguard.dlq`, which holds the rules; and the
schedules' pause / resume / run now, which call :mod:`django_jobguard.schedules`; and the
outbox's replay and skip of dead messages, which call :mod:`django_jobguard.outbox.operations`.
Payloads, stored results and tracebacks show only to users with ``jobguard.view_payload``.
"""

from .breakers import BreakerEventAdmin, FlowControlAdmin
from .dead_letters import DeadLetterAdmin
from .jobs import IdempotencyKeyAdmin, JobAdmin
from .locks import LockAdmin, LockReleaseAdmin
from .outbox import OutboxMessageAdmin
from .queue_health import QueueEventAdmin, QueueHealthAdmin
from .schedule_page import ScheduleAdmin
from .workers import WorkerAdmin
from .workflow_pages import WorkflowAdmin

__all__ = [
    "BreakerEventAdmin",
    "DeadLetterAdmin",
    "FlowControlAdmin",
    "IdempotencyKeyAdmin",
    "JobAdmin",
    "LockAdmin",
    "LockReleaseAdmin",
    "OutboxMessageAdmin",
    "QueueEventAdmin",
    "QueueHealthAdmin",
    "ScheduleAdmin",
    "WorkerAdmin",
    "WorkflowAdmin",
]
