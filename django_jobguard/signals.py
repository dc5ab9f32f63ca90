"""Signals django-jobguard sends. Definitions only: the package connects no receiver of its own.

Every signal is sent with ``sender=None`` and keyword arguments named in its comment.
Receivers run in the sending thread: keep them short, and never let them raise.
"""

from django.dispatch import Signal

#: A job row was written (``job``). Sent inside the caller's transaction.
job_enqueued = Signal()
#: A worker started an attempt (``job_id``, ``task_name``, ``attempt``).
job_started = Signal()
#: A job succeeded and was acked (``job_id``, ``task_name``, ``result``, ``duration``).
job_succeeded = Signal()
#: An attempt failed and the job was scheduled again (``job_id``, ``task_name``,
#: ``attempt``, ``error``, ``delay``).
job_retried = Signal()
#: A job was moved to the dead-letter queue (``dead_letter``).
job_dead_lettered = Signal()
#: A replay was requested, approved, rejected, or redriven as a new job (``dead_letter``,
#: ``user``; ``job`` for replay_redriven).
replay_requested = Signal()
replay_approved = Signal()
replay_rejected = Signal()
replay_redriven = Signal()
