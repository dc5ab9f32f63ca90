"""A reader process for the stampede test: THREADS threads miss one key at once.

``python -m tests.processes.refill_reader ALIAS KEY COUNTER THREADS MODE`` prints ``ready``,
waits for a line on stdin (so every process starts together), then each thread calls
``get_or_set(KEY, loader)``. The loader counts its calls with ``INCR COUNTER`` on Redis (a
counter every process shares) and sleeps a little; in MODE ``fail`` the first call raises.
Prints, as JSON, each thread's result (or ``"error: ..."``).
"""

import json
import sys
import threading
import time


def main() -> None:
    import django

    django.setup()
    from django.conf import settings
    from django.test import override_settings
    from django_redis import get_redis_connection

    from django_jobguard.cache import get_or_set

    alias, key, counter, threads, mode = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    redis = get_redis_connection(alias)
    redis.ping()  # connect before the start signal

    def loader() -> str:
        calls = redis.incr(counter)
        time.sleep(0.3)  # a slow query: the other readers miss meanwhile
        if mode == "fail" and calls == 1:
            raise RuntimeError("the first load failed")
        return f"loaded by call {calls}"

    results: list[str] = []
    start = threading.Barrier(threads)

    def read() -> None:
        start.wait()
        try:
            results.append(get_or_set(key, loader, 60, cache_alias=alias))
        except RuntimeError as exc:
            results.append(f"error: {exc}")

    # Patient waiters: a loaded machine must not make one give up and load a second time.
    patient = {**settings.JOBGUARD, "CACHE": {"REFILL_WAIT": 120.0, "REFILL_LEASE_TTL": 120.0}}
    with override_settings(JOBGUARD=patient):
        print("ready", flush=True)
        sys.stdin.readline()
        workers = [threading.Thread(target=read) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
