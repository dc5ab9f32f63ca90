"""The task of ``benchmarks/bench_encryption.py``: a payload in, a small result out.

Imported only with ``BENCH_ENCRYPTION=1`` (see tasks.py). Whether its jobs are stored
encrypted is ``JOBGUARD["ENCRYPTION"]["ALL_TASKS"]``, which the benchmark switches, so that
both modes run the same task.
"""

from django_jobguard import task


@task(name="bench.payload")
def payload(i: int, data: str, currency: str = "EUR") -> dict[str, int]:
    return {"i": i, "n": len(data)}
