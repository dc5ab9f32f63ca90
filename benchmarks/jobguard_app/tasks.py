"""No-op tasks, one per combination of safety features the benchmarks switch on.

Every task takes the job's index ``i`` so that the argument path is exercised and the
lock key differs per job (no contention: the benchmark measures the lock's cost, not
waiting for it).
"""

from django_jobguard import task


@task(name="bench.noop")
def noop(i: int) -> None:
    return None


@task(name="bench.noop_atomic", atomic=True)
def noop_atomic(i: int) -> None:
    return None


@task(name="bench.noop_locked", lock="bench:{i}")
def noop_locked(i: int) -> None:
    return None


@task(name="bench.noop_all", atomic=True, lock="bench:{i}")
def noop_all(i: int) -> None:
    return None


if __import__("os").environ.get("BENCH_FLOW"):
    from . import tasks_flow  # noqa: F401 - benchmarks/bench_flow.py's limited tasks

if __import__("os").environ.get("BENCH_WAIT"):
    from .tasks_wait import sleeps  # noqa: F401 - benchmarks/bench_wait.py's task

if __import__("os").environ.get("BENCH_KEYED"):
    from .tasks_keyed import noop_keyed  # noqa: F401 - benchmarks/bench_compare.py's keyed configuration

if __import__("os").environ.get("BENCH_ENCRYPTION"):
    from .tasks_encryption import payload  # noqa: F401 - benchmarks/bench_encryption.py's task

if __import__("os").environ.get("BENCH_ATOMIC"):
    from .tasks_atomic import insert_atomic  # noqa: F401 - benchmarks/bench_atomic.py's task


@task(name="bench.http_get")
async def http_get(host: str, port: int, i: int) -> int:
    """A slow call: one HTTP/1.1 GET to the benchmark's local server (it answers after 100 ms)."""
    from benchmarks._slow_http import get_async

    return await get_async(host, port, i)


if __import__("os").environ.get("BENCH_BREAKER"):
    from . import tasks_breaker  # noqa: F401 - benchmarks/bench_breaker.py's dependency
