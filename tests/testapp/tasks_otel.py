"""Tasks for the tracing tests (tests/integration/monitoring/ and tests/processes/, test_otel_*.py)."""

from __future__ import annotations

import logging

from django_jobguard import PermanentError, TransientError, task
from django_jobguard.log import job_fields

logger = logging.getLogger(__name__)


@task(takes_context=True, queue_name="otel", lock="order:{order_id}", max_attempts=3)
def checkout(context, order_id: int, card: str, failures: int = 0) -> int:
    """Fails ``failures`` times (transient), then succeeds; opens a span of its own in the handler."""
    from opentelemetry import trace  # the handler's own instrumentation, as a project would add

    with trace.get_tracer("tests.checkout").start_as_current_span("charge card"):
        if context.attempt <= failures:
            raise TransientError(f"order {order_id}: provider timeout {context.attempt}/{failures}")
    return order_id


@task(takes_context=True, queue_name="otel", max_attempts=2)
def refund(context, order_id: int) -> None:
    """Always fails: the first attempt transiently, the last one dead-letters."""
    raise TransientError(f"order {order_id}: refund provider down (attempt {context.attempt})")


@task(queue_name="otel")
def declined(order_id: int) -> None:
    """A permanent failure: dead-lettered on its first attempt."""
    raise PermanentError(f"order {order_id}: card declined")


@task(takes_context=True, queue_name="otel")
def logs_a_line(context, order_id: int) -> None:
    """Writes one structured log line about its job (the test reads its trace fields)."""

    class _Job:
        id = context.job_id
        task_name = "tests.testapp.tasks_otel.logs_a_line"
        queue_name = context.queue_name
        attempts = context.attempt
        idempotency_key = None
        lock_key = ""
        args: list[object] = []
        kwargs = {"order_id": order_id}

    logger.warning("otel_line order_id=%s", order_id, extra=job_fields(_Job()))


@task(queue_name="otel-bulk")
def noop(number: int) -> int:
    return number


@task(takes_context=True, queue_name="otel", max_attempts=3)
async def fetch(context, order_id: int, failures: int = 0) -> int:
    """A coroutine task (run by --async-slots): fails ``failures`` times, in a span of its own."""
    from opentelemetry import trace

    with trace.get_tracer("tests.fetch").start_as_current_span("call partner"):
        if context.attempt <= failures:
            raise TransientError(f"order {order_id}: partner timeout {context.attempt}/{failures}")
    return order_id


@task(queue_name="otel")
def reads_baggage(order_id: int) -> dict[str, object]:
    """Returns the baggage its handler sees (the tests compare it with the enqueuer's)."""
    from opentelemetry import baggage

    return dict(baggage.get_all())


@task(queue_name="otel")
async def reads_baggage_async(order_id: int) -> dict[str, object]:
    """:func:`reads_baggage` as a coroutine (run by --async-slots)."""
    from opentelemetry import baggage

    return dict(baggage.get_all())
