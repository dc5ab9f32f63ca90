"""No-op tasks under flow-control limits, for ``benchmarks/bench_flow.py``.

Imported only with ``BENCH_FLOW=1`` (see tasks.py): a limited task makes every worker that
claims all queues take the limited claim, which the other benchmarks must not measure.
"""

import time

from django_jobguard import Limit, Rate, task


@task(name="bench.flow_plain", queue_name="flow-plain")
def flow_plain(i: int, account: int) -> None:
    return None


@task(name="bench.flow_keyed", queue_name="flow-keyed", concurrency=Limit(1, key="account:{account}"))
def flow_keyed(i: int, account: int) -> None:
    return None


@task(name="bench.flow_rated", queue_name="flow-rated", rate=Rate("200/s", burst=10))
def flow_rated(i: int, account: int) -> None:
    return None


@task(name="bench.flow_clocked", queue_name="flow-pickup", concurrency=Limit(1, key="account:{account}"))
def flow_clocked(i: int, account: int) -> float:
    """``flow_keyed`` that returns when its handler began (the clock's epoch seconds)."""
    return time.time()
