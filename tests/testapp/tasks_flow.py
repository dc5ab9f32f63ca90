"""Tasks for the flow-control tests: limited handlers that record when they ran.

Limited tasks make every worker that claims all queues take the limited claim, so they
are registered only where a test asks for them: the ``flow_tasks`` fixture in-process, and
``JOBGUARD_TEST_FLOW=1`` in worker processes (tests/testapp/tasks.py imports this module
then, and it stays registered).
"""

from __future__ import annotations

import os
import time

from django_jobguard import JobContext, Limit, Rate, task
from django_jobguard.registry import registry

from .models import Execution, Interval

#: Seconds a killed worker's lease lasts: short, so its slots free within the test.
SHORT_LEASE = 3


@task(
    queue_name="flow-keyed", concurrency=Limit(2, key="account:{account_id}"), visibility_timeout=SHORT_LEASE
)
def per_account(account_id: int, seconds: float) -> None:
    """At most two per account run at once; records its run."""
    started = time.time()
    time.sleep(seconds)  # the handler's own work: it holds its slot this long
    Interval.objects.create(
        resource=f"account:{account_id}", started=started, ended=time.time(), pid=os.getpid()
    )


@task(queue_name="flow-global", concurrency=3, visibility_timeout=SHORT_LEASE)
def three_at_once(seconds: float) -> None:
    """At most three run at once across the fleet."""
    time.sleep(seconds)  # the handler's own work: it holds its slot this long


@task(queue_name="flow-rate", rate=Rate("20/s", burst=5))
def rated(n: int) -> None:
    """At most 20 starts a second, 5 at once; records its start."""
    now = time.time()
    Interval.objects.create(resource="rated", started=now, ended=now, pid=os.getpid())


@task(queue_name="flow-rate", rate=Rate("2/s", key="partner:{partner_id}", burst=2))
def per_partner(partner_id: int) -> None:
    """Two starts a second per partner."""


@task(queue_name="flow-shared", limit="flow-shared")
def shared_a(n: int) -> None:
    """Shares JOBGUARD["LIMITS"]["flow-shared"] with shared_b."""


@task(queue_name="flow-shared", limit="flow-shared")
def shared_b(n: int) -> None:
    """Shares JOBGUARD["LIMITS"]["flow-shared"] with shared_a."""


@task(queue_name="flow-shared", limit="flow-shared", concurrency=Limit(1, key="account:{account_id}"))
def shared_keyed(account_id: int) -> None:
    """Under the shared limit and one per account: counted under both."""


#: The test dependency's outage: an Interval row of this resource; calls fail between its
#: ``started`` and ``ended`` (wall clock), as a service that is down and then recovers.
OUTAGE = "dependency-outage"


class DependencyDown(ConnectionError):
    """The test dependency did not answer."""


@task(
    queue_name="flow-dep",
    limit="flow-dep",
    max_attempts=40,
    retry={"base": 0.2, "max": 0.6, "jitter": 0.1},
    retry_on=(DependencyDown,),
    atomic=True,
    takes_context=True,
    visibility_timeout=SHORT_LEASE,
)
def call_dependency(ctx: JobContext, n: int) -> None:
    """One call of the test dependency; a success is recorded with the ack (atomic)."""
    now = time.time()
    down = Interval.objects.filter(resource=OUTAGE, started__lte=now, ended__gt=now).exists()
    if down:
        raise DependencyDown(f"dependency down (call {n}, attempt {ctx.attempt})")
    Execution.objects.create(marker="dependency-ok", job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())


@task(queue_name="flow-plain")
def plain(n: int) -> None:
    """No limit: its queue's claims stay the plain claim."""


ALL = [per_account, three_at_once, rated, per_partner, shared_a, shared_b, shared_keyed, call_dependency]

if not os.environ.get("JOBGUARD_TEST_FLOW"):
    for _task in ALL:
        registry.unregister(_task.name)
