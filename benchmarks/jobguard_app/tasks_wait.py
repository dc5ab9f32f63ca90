"""benchmarks/bench_wait.py's task: a handler that takes a few milliseconds, so the waiter is
waiting (its row flagged) before the worker's ack commits."""

import time

from django_jobguard import task


@task(name="bench.sleeps")
def sleeps(i: int, ms: float = 20.0) -> int:
    time.sleep(ms / 1000)
    return i
