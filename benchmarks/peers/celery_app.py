"""Celery with the Redis broker and ``acks_late=True``, and the no-op task.

The task records its run in a second Redis database with one Lua call (a run counter
per job, start and end times): that is how the benchmark checks every job ran exactly
once and times first start to last completion, like the database queues' rows do.

Two configurations (``BENCH_CELERY_MODE``): ``tuned`` (the default here) does not store
results (``task_ignore_result``: the record above replaces them); ``default`` is Celery as
users run it: a Redis result backend (the broker's database) storing every task's result.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

QUEUE = "jgbench"
RECORD_KEYS = ["jgbench:runs", "jgbench:start", "jgbench:end", "jgbench:enq"]
_RECORD = """
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[4])
return 1
"""

DEFAULT_MODE = os.environ.get("BENCH_CELERY_MODE", "tuned") == "default"
BROKER = os.environ.get("BENCH_CELERY_BROKER", "redis://127.0.0.1:6379/6")

app = Celery("jgbench")
app.conf.update(
    broker_url=BROKER,
    result_backend=BROKER if DEFAULT_MODE else None,
    broker_connection_retry_on_startup=True,
    # Redis redelivers an unacked message after this; long enough never to fire here.
    broker_transport_options={"visibility_timeout": 3600},
    task_acks_late=True,
    task_ignore_result=not DEFAULT_MODE,
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=4,  # Celery's default, stated for the record
    worker_hijack_root_logger=False,
)

_record_client = redis.Redis.from_url(os.environ.get("BENCH_CELERY_RECORD", "redis://127.0.0.1:6379/7"))
_record = _record_client.register_script(_RECORD)


@app.task(name="jgbench.noop")
def noop(i: int, enqueued_at: float = 0.0) -> None:
    started = time.time()
    # The no-op itself.
    _record(keys=RECORD_KEYS, args=[i, repr(started), repr(time.time()), repr(enqueued_at)])
