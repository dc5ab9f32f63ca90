"""A no-op task under a keyed concurrency limit that never binds, for ``benchmarks/bench_compare.py``.

Imported only with ``BENCH_KEYED=1`` (see tasks.py): a limited task registered makes every
worker that claims all queues take the limited claim, which the other configurations must not
measure. Every job has a key of its own (``bench:{i}``), so no job ever waits for another:
the run measures what the limited claim and its bookkeeping cost, not waiting.
"""

from django_jobguard import Limit, task


@task(name="bench.noop_keyed", concurrency=Limit(1, key="bench:{i}"))
def noop_keyed(i: int) -> None:
    return None
