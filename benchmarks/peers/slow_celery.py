"""Celery for ``bench_slow_calls.py``: the slow-call task, Redis broker, ``acks_late=True``.

The worker is started as ``celery -A benchmarks.peers.slow_celery worker -P gevent -c 500``
(or ``-P threads -c 64``); Celery's own command line applies gevent's monkey-patching, so the
blocking socket of the task yields to the other greenlets. Results are not stored
(``task_ignore_result``); the broker's connection pool may grow to 1,000 (see below). The task
records its enqueue, start and finish times and its run count in a second Redis database with
one Lua call (the same record as ``celery_app.py``), through a pool of at most 8 connections so
that the record does not add one per slot.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from benchmarks._slow_http import get_blocking

QUEUE = "jgslow"
RECORD_KEYS = ["jgslow:runs", "jgslow:start", "jgslow:end", "jgslow:enq"]
_RECORD = """
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[4])
return 1
"""

app = Celery("jgslow")
app.conf.update(
    broker_url=os.environ.get("BENCH_CELERY_BROKER", "redis://127.0.0.1:6379/8"),
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": 3600,  # never redelivers during a run
        # The transport's pool holds 10 connections by default: with 500 greenlets acking at
        # once, acks fail (MaxConnectionsError) and their messages stay unacked. Room for all.
        "max_connections": 1000,
    },
    task_acks_late=True,
    task_ignore_result=True,
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=4,  # Celery's default, stated for the record
    worker_hijack_root_logger=False,
)

_pool = redis.BlockingConnectionPool.from_url(
    os.environ.get("BENCH_CELERY_RECORD", "redis://127.0.0.1:6379/9"), max_connections=8
)
_record = redis.Redis(connection_pool=_pool).register_script(_RECORD)


@app.task(name="jgslow.http_get")
def http_get(host: str, port: int, i: int, enqueued_at: float = 0.0) -> int:
    started = time.time()
    size = get_blocking(host, port, i)
    _record(keys=RECORD_KEYS, args=[i, repr(started), repr(time.time()), repr(enqueued_at)])
    return size
