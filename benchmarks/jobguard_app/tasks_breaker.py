"""A task that calls a dependency which is down for a while, for ``benchmarks/bench_breaker.py``.

Imported only with ``BENCH_BREAKER=1`` (see tasks.py): its ``limit="bench-dep"`` must be
declared in ``JOBGUARD["LIMITS"]``, which the other benchmarks do not do.
"""

import os
import time

from django_jobguard import task


class DependencyDownError(ConnectionError):
    """The dependency did not answer."""


@task(
    name="bench.call_dependency",
    queue_name="bench-dep",
    limit="bench-dep",
    max_attempts=8,
    retry={"base": 1, "max": 10, "jitter": 1},
    retry_on=(DependencyDownError,),
    idempotent=True,
)
def call_dependency(i: int) -> None:
    """Fails (after 10 ms, a timeout's stand-in) between BENCH_OUTAGE_FROM and BENCH_OUTAGE_UNTIL."""
    now = time.time()
    if float(os.environ["BENCH_OUTAGE_FROM"]) <= now < float(os.environ["BENCH_OUTAGE_UNTIL"]):
        time.sleep(0.01)
        raise DependencyDownError(f"call {i}: the dependency is down")
