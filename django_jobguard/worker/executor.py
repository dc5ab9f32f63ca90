"""Executor threads: each takes claimed jobs one at a time, runs the pipeline and settles the outcome."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import DatabaseError, InterfaceError, connections

from .. import store
from ..conf import get_settings
from ..log import log_job_exception
from ..outcome import HandBack, HeldState
from . import pipeline
from .held import LOGGER_NAME, Held, reset_after_db_error

if TYPE_CHECKING:
    from .completer import Completer
    from .pipeline import Runtime
    from .slots import Slots

logger = logging.getLogger(LOGGER_NAME)

__all__ = ["CONNECTION_CHECK_AFTER_IDLE_SECONDS", "Executor", "hand_back"]

#: An executor idle this long checks its connection before the next job, so a connection
#: the database dropped meanwhile (restart, failover, idle timeout) costs that job no attempt.
CONNECTION_CHECK_AFTER_IDLE_SECONDS = 1.0


def hand_back(held: Held) -> HandBack:
    """The outcome of a job the worker gives back because it stops."""
    return HandBack(started=held.state in (HeldState.RUNNING, HeldState.ABANDONED))


class Executor:
    """One executor thread's work: jobs from the slots, run through the pipeline, settled."""

    def __init__(self, slots: Slots, completer: Completer, runtime: Runtime) -> None:
        self.slots = slots
        self.completer = completer
        self.runtime = runtime
        self.alias = runtime.alias
        self.worker_id = runtime.worker_id
        #: Runs and settles a job in its trace's spans; None (and no OpenTelemetry import)
        #: unless JOBGUARD["OPENTELEMETRY"] is on.
        self._traced: Callable[[Held], None] | None = None
        if get_settings().opentelemetry:
            from . import tracing  # an optional extra: imported only when enabled

            self._traced = functools.partial(
                tracing.run, runtime=runtime, completer=completer, run_pipeline=pipeline.run
            )

    def run(self) -> None:
        """Run jobs until the slots say to exit or this thread is replaced."""
        cursor_lock = store.cursor_lock(self.alias)  # so shutdown can cut its connection (SQLite)
        try:
            while True:
                idle_since = time.monotonic()
                held = self.slots.next()
                if held is None:
                    return
                if time.monotonic() - idle_since >= CONNECTION_CHECK_AFTER_IDLE_SECONDS:
                    self._drop_unusable_connection()
                held.cursor_lock = cursor_lock
                if self.run_one(held):
                    return
        finally:
            connections.close_all()

    def run_one(self, held: Held) -> bool:
        """Run (or hand back) one held job and settle it; whether this thread was replaced meanwhile.

        Also the in-process path of :func:`django_jobguard.testing.run_jobs`, which runs the
        held jobs one by one on the test's own thread and connection.
        """
        try:
            if self.slots.start(held, connections[self.alias]):
                if self._traced is None:
                    self.completer.settle_run(held, pipeline.run(held, self.runtime))
                else:
                    self._traced(held)
            elif held.state is HeldState.WAITING:
                self.completer.settle(held, hand_back(held))
        except (DatabaseError, InterfaceError):
            reset_after_db_error(held, self.worker_id, self.alias, "connection reset")
        except Exception:
            log_job_exception(
                logger,
                logging.ERROR,
                "job_crashed job_id=%s",
                held.job.id,
                job=held.job,
                worker_id=self.worker_id,
                outcome="crashed",
            )
        finally:
            replaced = self.slots.finish(held)
        return replaced

    def _drop_unusable_connection(self) -> None:
        """Close this thread's connection if the database dropped it; the next query reconnects."""
        connection = connections[self.alias]
        if connection.connection is not None and not connection.is_usable():
            logger.info("connection_reset worker_id=%s; the database had dropped it", self.worker_id)
            connection.close()
