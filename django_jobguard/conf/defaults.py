"""Every ``JOBGUARD`` key with its default and a comment saying what it does.

The settings reference (docs/reference/settings.md) is generated from ``DEFAULTS`` below and the
comment above each key, so a key without a comment fails the docs build. The other modules of
this package parse and validate these values, one area each.
"""

from __future__ import annotations

from typing import Any

DEFAULT_VISIBILITY_TIMEOUT_SECONDS = 60
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
DEFAULT_MAX_PAYLOAD_DEPTH = 64
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024

#: Every setting with its default. The settings reference in docs/ is generated from this.
DEFAULTS: dict[str, Any] = {
    # Database alias that stores jobs, keys and dead letters. Enqueue joins the caller's
    # transaction only when it runs on this alias; with the jobs in a database of their own,
    # enqueue through the outbox to keep it in the application's transaction (OUTBOX
    # DATABASE_ALIAS and the "jobs" destination: the how-to "Run jobs in their own database").
    "DATABASE_ALIAS": "default",
    # What holds the jobs of DATABASE_ALIAS: "database" (its tables) or, for tests only,
    # "memory": an in-memory store in this process (django_jobguard.store.memory), so a test
    # with no database can enqueue and run jobs. Nothing is durable or seen by another process;
    # workflows, replays and the console need the database. Refused (jobguard.E059, and
    # ImproperlyConfigured at the first enqueue) unless Django's test environment is set up
    # (its test runner, pytest-django) or DEBUG is on.
    "STORE": "database",
    # Queue used when a task names none (at most 100 characters, the width of the queue columns).
    "DEFAULT_QUEUE": "default",
    # Per-queue options: visibility_timeout, max_attempts, retry, recoverable_retry, and
    # concurrency (jobs of the queue running at once across every worker). Once any
    # queue is declared here, enqueue, jobguard_worker --queue and jobguard_status --queue
    # refuse a queue that is neither declared nor DEFAULT_QUEUE. A queue name has at most 100
    # characters.
    "QUEUES": {},
    # Shared limits that tasks name with @task(limit="stripe"): {"stripe": {"rate": "25/s",
    # "burst": 25, "concurrency": 10}}. Each entry needs rate, concurrency, breaker or
    # retry_budget; burst defaults to one second's worth of the rate. "breaker": True (or a dict
    # of failure_rate, min_calls, window, open_for, probes) stops claiming the dependency's jobs
    # while its transient failures run high; "retry_budget": True (or a dict of ratio,
    # min_retries, window) caps its retries at a fraction of its first attempts. Enforced at
    # claim across every worker. A name has at most 100 characters with a breaker or a
    # retry_budget (their state is kept under it) and 244 with a rate (kept as rate:limit:<name>).
    "LIMITS": {},
    # Accept queue names QUEUES does not declare (free-form queues, as with no QUEUES at all).
    "ALLOW_UNDECLARED_QUEUES": False,
    # Bytes a job's args and kwargs may take together as compact UTF-8 JSON (1 MiB); checked
    # at enqueue and replay, before anything is written.
    "MAX_PAYLOAD_BYTES": DEFAULT_MAX_PAYLOAD_BYTES,
    # Bytes a task's return value may take as the JSON the worker stores (1 MiB; json.dumps,
    # ASCII, so one byte per character). A larger one is refused at the handler's return: the
    # job is dead-lettered as permanent (reason invalid_result) and nothing of it is stored.
    # @task(max_result_bytes=...) sets a task's own limit. A handler returning None is not measured.
    "MAX_RESULT_BYTES": DEFAULT_MAX_RESULT_BYTES,
    # Seconds the queue gauges of one /metrics scrape are reused by the next ones: one set of
    # queries per interval however many scrapers ask (their cost grows with the backlog). 0
    # computes them at every scrape.
    "METRICS_CACHE_SECONDS": 5.0,
    # Queue names not declared in QUEUES that one process gives a metric label of their own;
    # past that they are counted under queue="other", so free-form names cannot grow the
    # series without bound.
    "METRICS_MAX_UNDECLARED_QUEUES": 20,
    # Characters of an error message and of a traceback stored per attempt (on the job, its
    # attempt history and its dead letter); longer ones keep their head and tail.
    "MAX_ERROR_CHARS": 8192,
    # Argument names whose values are kept out of logs and stored error text: a keyword
    # argument (or a key of a dict at any depth of the payload) with one of these names, in any
    # case, has each of its values replaced by "[redacted]" in the error messages and
    # tracebacks stored on jobs, attempts and dead letters, and in the keys log records carry.
    # Best effort: it replaces the values' text wherever it appears. Payloads are kept as sent.
    "REDACT": [],
    # Levels of nesting one argument, a result or a checkpoint may have ([] is one level).
    "MAX_PAYLOAD_DEPTH": DEFAULT_MAX_PAYLOAD_DEPTH,
    # Seconds a claimed job stays invisible to other workers without a heartbeat.
    "VISIBILITY_TIMEOUT": DEFAULT_VISIBILITY_TIMEOUT_SECONDS,
    # Attempts before a failing job is dead-lettered (the first run counts).
    "MAX_ATTEMPTS": DEFAULT_MAX_ATTEMPTS,
    # Backoff for transient errors: min(max, base * 2**(attempt-1)) + uniform(0, jitter).
    "RETRY": {"base": 5.0, "max": 300.0, "jitter": 3.0},
    # Backoff for recoverable errors (a degraded dependency): the same formula, longer.
    "RECOVERABLE_RETRY": {"base": 60.0, "max": 3600.0, "jitter": 30.0},
    # How an exception that is not classified is treated: "transient" or "permanent".
    "UNCLASSIFIED_ERRORS": "transient",
    # Handler version recorded on jobs and dead letters when a task names none (at most 64
    # characters).
    "HANDLER_VERSION": "",
    # Worker: seconds an idle worker waits between polls (LISTEN/NOTIFY wakes it sooner).
    "POLL_INTERVAL": 1.0,
    # Worker: seconds between passes of the reaper over expired leases.
    "REAPER_INTERVAL": 2.0,
    # Worker: most jobs held and claimed per round trip. 0 adapts: twice the concurrency,
    # then, once the worker has seen its jobs are short, about 20 ms of work per thread (at
    # most 64); for jobs over a second, only what its threads can start.
    "BATCH_SIZE": 0,
    # Worker: seconds in-flight jobs get to finish after SIGTERM before they are handed back.
    "SHUTDOWN_GRACE": 30.0,
    # Worker: seconds the acks of non-atomic tasks wait to be written together, in one
    # statement and one commit (ACK_BATCH_SIZE acks flush at once). A crash in that window
    # runs those jobs again, as a crash before any ack does. 0 writes each ack on its own.
    "ACK_WINDOW": 0.005,
    # Worker: the most acks written in one statement.
    "ACK_BATCH_SIZE": 100,
    # Worker: run the reaper, redrive and key pruning only in the one worker holding the
    # leadership row (a database lease, PgBouncer-safe); others skip them. Saves queries with
    # many workers; a dead leader delays reaping by up to three REAPER_INTERVALs.
    "MAINTENANCE_LEADER": False,
    # Worker: a file the heartbeat thread touches (at most once a second) while it runs, for a
    # liveness probe (e.g. Kubernetes exec: fail when older than a minute); "" for none.
    "LIVENESS_FILE": "",
    # Worker: its name in job rows and logs; "" means host:pid:random (unique across hosts).
    # Set it per container (e.g. from the pod name); --worker-id overrides it.
    "WORKER_ID": "",
    # Database aliases that reach PostgreSQL through a pooler in transaction mode (PgBouncer):
    # jobguard keeps no session state on them and checks their settings (jobguard.W060).
    "POOLED_DATABASES": [],
    # Alias the worker LISTENs on for enqueue wake-ups; "" means DATABASE_ALIAS unless that
    # is pooled (then workers poll). Point it at a direct connection that bypasses the pooler.
    "LISTEN_DATABASE": "",
    # Alias of a django-redis cache through which enqueues wake idle workers (Redis pub/sub),
    # for a database without LISTEN/NOTIFY (SQLite, MariaDB/MySQL) or a pooled PostgreSQL.
    # "" (the default): workers find new jobs at their next poll there.
    "WAKEUP_CACHE": "",
    # How an enqueue on PostgreSQL wakes idle workers through NOTIFY. A transaction that
    # notifies takes one lock of the whole PostgreSQL server while it commits, so such commits
    # run one at a time. "coalesced": after the enqueue's commit, a thread of the enqueuing
    # process (with a connection of its own) sends the NOTIFY, at most one per queue every
    # NOTIFY_INTERVAL seconds, so the application's commits never take that lock and never wait
    # for it. "row": a trigger notifies inside each enqueuing transaction (every such commit
    # waits its turn). "none": no NOTIFY; workers poll every POLL_INTERVAL, or wake through
    # WAKEUP_CACHE. migrate installs the choice in the database (the jobs' triggers read it);
    # run it after changing this.
    "NOTIFY": "coalesced",
    # With NOTIFY "coalesced": seconds a process waits after a NOTIFY before it sends the next
    # (naming the queues enqueued meanwhile). An idle worker starts a new job at most about
    # this long after its commit.
    "NOTIFY_INTERVAL": 0.05,
    # Carry the OpenTelemetry trace context from the code that enqueues to the worker that
    # runs, with spans from the tracer provider the project configured (extra: [otel]).
    "OPENTELEMETRY": False,
    # With OPENTELEMETRY: the worker's span is a child of the enqueuing span (one trace)
    # instead of the start of a trace of its own that links to it.
    "OPENTELEMETRY_PARENT": False,
    # With OPENTELEMETRY: the names of the baggage entries that cross the queue (stored with
    # the job, restored for its handler), e.g. ["tenant.id"]. Empty (the default): none does,
    # so a caller's baggage header is neither stored nor handed to a worker.
    "OPENTELEMETRY_BAGGAGE": [],
    "LOCKS": {
        # "database" (embedded default, any database) or "redis" (django-redis).
        "BACKEND": "database",
        # Cache alias whose django-redis connection the redis back end uses.
        "CACHE_ALIAS": "default",
        # Prefix of every lock key, so keys read jobguard:lock:order:123 (at most 254 characters:
        # the lock table's key column holds 255 with the key).
        "PREFIX": "jobguard:lock:",
        # Seconds a task lock lives without renewal; the heartbeat renews it.
        "TTL": 30.0,
        # Seconds a job waits before it is retried when its lock is taken (no attempt used).
        "CONTENTION_DELAY": 2.0,
    },
    "IDEMPOTENCY": {
        # Seconds an idempotency key is remembered after it was created.
        "TTL": 7 * 24 * 3600.0,
        # Let each worker prune expired keys while idle.
        "PRUNE_IN_WORKER": False,
        # Seconds the key's job (not run yet) may be due after the time a repeat enqueue asks
        # for; later than that, the repeat is an IdempotencyScheduleConflict, not a duplicate.
        "SCHEDULE_TOLERANCE": 300.0,
    },
    "REPLAY": {
        # Let the user who requested a replay approve it too.
        "ALLOW_SELF_APPROVAL": False,
        # Approved replays redriven per minute at most, across all workers, until an approver
        # changes the rate on the admin's Redrive rate page (dlq.set_rate), which every worker
        # follows at its next pass; clearing it there comes back to this value.
        "RATE_PER_MINUTE": 60,
    },
    "CACHE": {
        # Cache alias that invalidate(), invalidates(), set_versioned() and get_versioned() use
        # when the call names none.
        "ALIAS": "default",
        # Seconds the tombstone of a versioned invalidation lives: it must outlast the longest
        # time between a reader loading a row and writing it to the cache.
        "TOMBSTONE_TTL": 60.0,
        # Whether invalidate() and invalidates() are durable when the call does not say: the
        # keys are also written to a job in the writer's transaction, which a worker runs if
        # the delete after the commit did not happen (process killed, cache unreachable).
        "DURABLE": False,
        # Queue of the durable invalidation jobs; workers serve every queue unless --queue is given.
        "QUEUE": "jobguard.cache",
        # Attempts of a durable invalidation job while the cache is unreachable (the queue's
        # retry schedule spaces them) before it is dead-lettered.
        "MAX_ATTEMPTS": 20,
        # Seconds a durable invalidation job waits before a worker may run it: the committing
        # process deletes the keys itself and removes the job well within it.
        "DURABLE_DELAY": 5.0,
        # Seconds a get_or_set() refill lease lives: a loader that hangs blocks the others no longer.
        "REFILL_LEASE_TTL": 10.0,
        # Seconds a get_or_set() miss waits for another caller's refill before loading itself.
        "REFILL_WAIT": 3.0,
    },
    "TUNING": {
        # Seconds a heartbeat may come late in a slow moment (a busy machine, a database that
        # answers late). A visibility timeout should exceed a task's expected duration by it,
        # a lock TTL should be at least twice it, and jobguard_tune recommends no less.
        "HEARTBEAT_MARGIN": 5.0,
        # jobguard_tune recommends a visibility timeout of the observed p99 duration times this.
        "SAFETY_FACTOR": 2.0,
        # Tasks of one queue whose durations differ by more than this factor should be split
        # into a fast and a slow queue (check jobguard.W006, jobguard_tune).
        "QUEUE_SPLIT_FACTOR": 20.0,
        # Seconds of finished jobs that `check --database` reads for observed durations.
        "WINDOW": 24 * 3600.0,
        # Finished runs of a task in the window before its observed durations are trusted.
        "MIN_RUNS": 20,
    },
    "API": {
        # Largest JSON size, in bytes, of a job's args plus kwargs accepted by the REST API
        # (POST jobs/ and corrected replay payloads); a bigger one is refused with 400.
        "MAX_PAYLOAD_BYTES": 256 * 1024,
        # Deepest nesting of lists and objects accepted in args and kwargs over the REST API.
        "MAX_DEPTH": 32,
        # Jobs and dead letters per page of the REST API's lists (?page_size= up to MAX_PAGE_SIZE).
        "PAGE_SIZE": 50,
        # Largest ?page_size= a REST API list accepts.
        "MAX_PAGE_SIZE": 500,
        # DRF throttle rate of POST jobs/ per user ("600/minute"), or None for no limit.
        "ENQUEUE_THROTTLE_RATE": "600/minute",
        # DRF throttle rate of the other REST API writes (cancel, retry, replay steps) per user.
        "OPERATE_THROTTLE_RATE": "120/minute",
        # Seconds before now a run_after sent to the REST API may lie (older is refused, 400).
        "RUN_AFTER_PAST": 24 * 3600.0,
        # Seconds after now a run_after sent to the REST API may lie (later is refused, 400).
        "RUN_AFTER_FUTURE": 365 * 24 * 3600.0,
    },
    "HORIZON": {
        # Seconds a transaction, a replication slot or a standby (hot_standby_feedback) may hold
        # PostgreSQL's vacuum horizon before the workers name it in a WARNING (again every as
        # many seconds while it holds), jobguard_status and the queues page. While it holds,
        # no dead job row of the cluster can be vacuumed and claims slow down. PostgreSQL only.
        "WARN_AFTER": 300.0,
        # Seconds between two looks at what holds the horizon (one query on pg_stat_activity,
        # pg_prepared_xacts, pg_replication_slots and pg_stat_replication), by the worker that
        # runs maintenance; 0 turns the watcher off.
        "INTERVAL": 30.0,
        # Seconds an atomic=True task may run (its timeout, else its expected_duration) before
        # check jobguard.W064 warns: its transaction holds the horizon for the whole run.
        "ATOMIC_TIMEOUT": 60.0,
    },
    "RETENTION": {
        # Seconds a succeeded job is kept after it finished; then the worker that prunes deletes
        # it (a job a live idempotency key answers with, or a member of a workflow not finished,
        # stays until neither holds). None keeps succeeded jobs. A queue may set its own:
        # QUEUES[name]["retention"] = {"succeeded": ..., "cancelled": ..., "dead": ...}.
        "SUCCEEDED": 24 * 3600.0,
        # Seconds a cancelled job is kept after it finished (the same exceptions); None keeps them.
        "CANCELLED": 7 * 24 * 3600.0,
        # Seconds a dead job is kept after it finished, once its dead letter is replayed (or
        # gone): a job whose dead letter waits for a decision stays however old. None keeps them.
        "DEAD": 7 * 24 * 3600.0,
        # Seconds between two pruning passes, run by one elected worker (the maintenance leader
        # with MAINTENANCE_LEADER, else the holder of the lease row jobguard:leader:retention) on
        # a thread of its own, in batches. 0 turns pruning in workers off: jobguard_prune still
        # applies these rules when run by hand or from cron.
        "INTERVAL": 60.0,
        # Jobs deleted per transaction by a pruning pass (and by jobguard_prune).
        "BATCH_SIZE": 500,
        # Seconds a succeeded job's result can be waited for (Job.wait()) after it finished; past
        # it, wait() raises ResultExpired instead of returning it. None: as long as the job's row
        # is kept (SUCCEEDED above). A task's own @task(result_retention=...) comes first.
        "RESULTS": None,
        # Seconds a delivered outbox message is kept after its delivery; then the same pass
        # deletes it. A pending, dead or held message is never deleted, nor one its key's relay
        # has not passed yet; a key's own rows stay (its sequence goes on), except those of a
        # message published without a key, which go with it. None keeps them.
        "OUTBOX_DELIVERED": 24 * 3600.0,
        # Seconds an outbox message an operator skipped is kept after the decision (its who and
        # why are on it). None keeps them.
        "OUTBOX_SKIPPED": 7 * 24 * 3600.0,
    },
    # Recurring jobs declared in settings: {"name": {"task": "app.tasks.f", "cron": "0 2 * * *",
    # "timezone": "UTC", "args": [], "kwargs": {}, "queue_name": None, "missed": "run_once"}}.
    # Tasks can declare their own with @task(schedule="*/5 * * * *").
    "SCHEDULES": {},
    "SCHEDULER": {
        # Seconds between two passes of a worker's scheduler over the schedules that are due.
        "INTERVAL": 1.0,
        # Seconds after its time past which a tick not yet enqueued counts as missed (then the
        # schedule's "missed" policy decides); ticks younger than this are all enqueued.
        "MISSED_AFTER": 60.0,
        # Missed ticks a "catch_up" schedule enqueues at most after an outage (the latest ones).
        "CATCH_UP_MAX": 100,
    },
    "ENCRYPTION": {
        # Keys that encrypt payloads at rest, as "key_id:base64" strings (32 random bytes each,
        # from `manage.py jobguard_encryption_key`): the first encrypts, every one decrypts, as
        # Django's SECRET_KEY_FALLBACKS. Empty: read KEYS_ENV instead.
        "KEYS": [],
        # The environment variable read when KEYS is empty: the same strings, comma-separated.
        "KEYS_ENV": "JOBGUARD_ENCRYPTION_KEYS",
        # Encrypt every task's data, not only that of tasks declared with @task(encrypt=True).
        "ALL_TASKS": False,
    },
    "OUTBOX": {
        # Destinations that django_jobguard.outbox.publish() may name: {"orders": {"BACKEND":
        # "redis", "URL": "redis://...", "STREAM": "orders"}}. BACKEND is "webhook", "rabbitmq",
        # "nats", "redis" or a dotted path to a class; ON_FAILURE is "hold" (the default: a
        # message that cannot be delivered holds the messages behind it of its key until an
        # operator replays or skips it) or "skip" (it is set aside and the key moves on);
        # MAX_ATTEMPTS (20) attempts a message gets; RETRY ({"base", "max", "jitter"} over the
        # global RETRY) spaces them; LIMIT names an entry of LIMITS whose concurrency, rate,
        # breaker and retry budget hold its sends, as @task(limit=...) holds a task's jobs. The
        # other keys are the backend's own options; the system check builds every destination
        # at startup (jobguard.E060). A name has at most 100 characters.
        "DESTINATIONS": {},
        # The database alias of the outbox tables: publish() writes its message there, in the
        # caller's transaction on that database, and the relay reads them there. None: the jobs'
        # DATABASE_ALIAS. Name the application's database when the jobs have their own, and
        # declare a destination with BACKEND "jobs": enqueue_via_outbox() then enqueues in the
        # application's transaction (the how-to "Run jobs in their own database").
        "DATABASE_ALIAS": None,
        # Run the relay, which delivers published messages, inside every jobguard_worker that
        # is not --burst (when a destination is declared).
        "RELAY": True,
        # Messages of one key a relay thread delivers (one at a time, in order) before it gives
        # the key back and takes another: a busy key cannot keep a thread from the others.
        "RELAY_BATCH_SIZE": 100,
        # Seconds an idle relay waits before it looks for undelivered messages again.
        "RELAY_POLL_INTERVAL": 0.5,
        # Seconds a relay holds a key without renewing its lease (renewed before each send).
        # A relay killed mid-key leaves it this long; a send must take less (a destination's
        # timeout well below it), or another relay may send the key's next messages meanwhile.
        "RELAY_LEASE": 60.0,
        # Threads of each worker's relay: keys delivered at once by one worker process.
        "RELAY_CONCURRENCY": 4,
    },
    "TESTING": {
        # How enqueued jobs run, for tests (django_jobguard.testing) and eager setups: "manual"
        # (the default: a job is stored and waits for a worker, or for the test's run_jobs())
        # or "inline" (the enqueuing process runs it through the worker's pipeline once the
        # enqueuing transaction commits, never before; a rolled-back transaction's jobs never
        # run). Inline mode is installed by django_jobguard.testing (its pytest plugin and
        # JobguardTestMixin import it) or by the app at start when this says "inline".
        "MODE": "manual",
    },
}
