"""Celery's task signals, sent by the Celery-style tasks' handlers around each run.

Connect receivers as with Celery (``@task_prerun.connect`` or
``task_prerun.connect(receiver)``); each is sent with Celery's keyword arguments, in the
worker's thread. jobguard's own signals (``django_jobguard.signals``) are sent for every task
as well: ``job_started``, ``job_succeeded``, ``job_retried``, ``job_dead_lettered``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.dispatch import Signal as DjangoSignal

__all__ = [
    "NEVER_SENT",
    "Signal",
    "after_setup_logger",
    "after_setup_task_logger",
    "setup_logging",
    "task_failure",
    "task_postrun",
    "task_prerun",
    "task_retry",
    "task_success",
]


class Signal(DjangoSignal):
    """A Django signal whose ``connect`` also works as a decorator, bare or with options, as Celery's."""

    def connect(
        self,
        receiver: Any = None,
        sender: Any = None,
        weak: bool = True,
        dispatch_uid: Any = None,
        **kwargs: Any,
    ) -> Any:
        if receiver is None:

            def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
                super(Signal, self).connect(function, sender=sender, weak=weak, dispatch_uid=dispatch_uid)
                return function

            return decorate
        super().connect(receiver, sender=sender, weak=weak, dispatch_uid=dispatch_uid)
        return receiver


#: Before the function runs (``task_id``, ``task``, ``args``, ``kwargs``); sender: the task.
task_prerun = Signal()
#: After it ran, whatever the outcome (``task_id``, ``task``, ``args``, ``kwargs``, ``retval``,
#: ``state``); sender: the task.
task_postrun = Signal()
#: It returned (``result``); sender: the task.
task_success = Signal()
#: It raised and will not run again (``task_id``, ``exception``, ``args``, ``kwargs``,
#: ``traceback``, ``einfo`` None); sender: the task.
task_failure = Signal()
#: It will run again: ``self.retry()`` was called, or it raised an ``autoretry_for`` error
#: with attempts left (``request``, ``reason``, ``einfo`` None); sender: the task.
task_retry = Signal()

#: Celery's logging signals exist so that a project's ``celery.py`` that connects to them
#: imports unchanged (cookiecutter-django's connects ``setup_logging`` to apply Django's
#: ``LOGGING``). They are never sent: ``jobguard_worker`` is a management command, so Django
#: has applied ``LOGGING`` already, and the worker does not configure logging itself. A
#: receiver connected to one is named by ``jobguard.celery.W006``.
setup_logging = Signal()
after_setup_logger = Signal()
after_setup_task_logger = Signal()

#: The signals above, by Celery's name.
NEVER_SENT: dict[str, Signal] = {
    "setup_logging": setup_logging,
    "after_setup_logger": after_setup_logger,
    "after_setup_task_logger": after_setup_task_logger,
}
