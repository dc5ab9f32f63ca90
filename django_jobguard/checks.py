"""Django system checks (``jobguard.E0xx`` errors, ``jobguard.W0xx`` warnings).

IDs are listed in docs/reference/checks.md; a retired ID is never reused.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from . import cache, schedules, store
from ._redis import is_django_redis
from .conf import ScheduleConfig, Settings, get_settings
from .exceptions import InvalidArgumentsError, InvalidScheduleError
from .registry import registry
from .tuning import observed_durations, recommend_timeout, split_needed, task_timeout

if TYPE_CHECKING:
    from .task import Task


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E001: the JOBGUARD setting is invalid."""
    try:
        get_settings()
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                str(exc),
                hint="See the settings reference in the django-jobguard docs (docs/reference/settings.md).",
                id="jobguard.E001",
            )
        ]
    return []


# Not tagged "database": these read settings only and never connect, so they run with
# every command (Django skips database-tagged checks unless --database is given).
@checks.register()
def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E002: unknown alias; E003: unsupported database; W001: SQLite without IMMEDIATE;
    E050, E051: a MariaDB/MySQL alias not configured for utf8mb4 and READ COMMITTED."""
    try:
        alias = get_settings().database_alias
    except ImproperlyConfigured:
        return []
    if alias not in connections.settings:
        return [
            checks.Error(
                f"JOBGUARD['DATABASE_ALIAS'] is {alias!r}, which is not in DATABASES.",
                hint="Name one of your DATABASES aliases.",
                id="jobguard.E002",
            )
        ]
    connection = connections[alias]
    messages: list[checks.CheckMessage] = []
    if connection.vendor not in store.supported_vendors():
        messages.append(
            checks.Error(
                f"django-jobguard supports PostgreSQL, MariaDB/MySQL and SQLite; {alias!r} is "
                f"{connection.vendor}.",
                hint="Point JOBGUARD['DATABASE_ALIAS'] at a PostgreSQL, MariaDB/MySQL or SQLite database.",
                id="jobguard.E003",
            )
        )
    elif connection.vendor == "sqlite":
        options = connection.settings_dict.get("OPTIONS", {})
        if options.get("transaction_mode") != "IMMEDIATE":
            messages.append(
                checks.Warning(
                    "SQLite without OPTIONS['transaction_mode'] = 'IMMEDIATE': concurrent workers "
                    "can fail with 'database is locked' when a transaction upgrades to a write.",
                    hint="Set OPTIONS={'transaction_mode': 'IMMEDIATE', 'timeout': 20} "
                    "(and 'init_command': 'PRAGMA journal_mode=WAL;').",
                    id="jobguard.W001",
                )
            )
    elif connection.vendor == "mysql":
        messages += _mysql_options(alias, connection.settings_dict.get("OPTIONS", {}))
    return messages


#: What a MariaDB/MySQL alias must say in its OPTIONS (the fix every check below names).
MYSQL_OPTIONS_HINT = (
    "OPTIONS={'charset': 'utf8mb4', 'isolation_level': 'read committed', "
    "'init_command': \"SET time_zone = '+00:00'\"}"
)


def _mysql_options(alias: str, options: dict[str, Any]) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    charset = str(options.get("charset", "utf8"))  # Django's default is utf8 (utf8mb3)
    if charset.lower() != "utf8mb4":
        messages.append(
            checks.Error(
                f"DATABASES[{alias!r}] talks to MariaDB/MySQL in {charset}: a job's arguments, "
                "errors or keys with characters outside the Basic Multilingual Plane (emoji) "
                "fail or lose characters.",
                hint=f"Set {MYSQL_OPTIONS_HINT}, with tables in utf8mb4 (docs/how-to/choose-a-database.md).",
                id="jobguard.E050",
            )
        )
    # Django's default for MySQL is READ COMMITTED; REPEATABLE READ (the server's default)
    # takes gap locks that deadlock concurrent enqueues and claims.
    isolation = str(options.get("isolation_level", "read committed")).lower()
    if isolation != "read committed":
        messages.append(
            checks.Error(
                f"DATABASES[{alias!r}] runs at {isolation.upper()}: InnoDB then takes gap and "
                "next-key locks, so concurrent enqueues, claims and deletes of finished jobs "
                "deadlock one another.",
                hint=f"Set {MYSQL_OPTIONS_HINT} (READ COMMITTED is the level django-jobguard needs).",
                id="jobguard.E051",
            )
        )
    return messages


@checks.register(checks.Tags.caches)
def check_lock_backend(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E004: the Redis lock back end names a cache that is not django-redis."""
    try:
        locks = get_settings().locks
    except ImproperlyConfigured:
        return []
    if locks.backend != "redis":
        return []
    cache = getattr(settings, "CACHES", {}).get(locks.cache_alias)
    if cache is None:
        problem = "is not in CACHES"
    elif not is_django_redis(str(cache.get("BACKEND", ""))):
        problem = (
            f"has BACKEND {cache.get('BACKEND')!r}; the Redis lock back end needs django-redis "
            "(or a subclass of its cache)"
        )
    else:
        return []
    return [
        checks.Error(
            f"JOBGUARD['LOCKS']['CACHE_ALIAS'] is {locks.cache_alias!r}, which {problem}.",
            hint="Point it at a cache with BACKEND 'django_redis.cache.RedisCache', or set "
            "JOBGUARD['LOCKS']['BACKEND'] = 'database'.",
            id="jobguard.E004",
        )
    ]


@checks.register(checks.Tags.caches)
def check_cache_alias(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E005: the cache invalidation feature names a cache alias that is not in CACHES.

    Only when the feature is configured (``JOBGUARD["CACHE"]`` given) or used (a model
    declared with ``cache.invalidates()``), so projects that do not use it are not bothered.
    """
    try:
        alias = get_settings().cache.alias
    except ImproperlyConfigured:
        return []
    raw = getattr(settings, "JOBGUARD", None)
    wanted: dict[str, str] = {}
    declared = cache.declarations()
    if (isinstance(raw, dict) and "CACHE" in raw) or any(d.cache_alias is None for d in declared):
        wanted[alias] = "JOBGUARD['CACHE']['ALIAS']"
    for declaration in declared:
        if declaration.cache_alias is not None:
            wanted.setdefault(
                declaration.cache_alias, f"invalidates({declaration.model._meta.label})'s cache_alias"
            )
    configured = getattr(settings, "CACHES", {})
    return [
        checks.Error(
            f"{where} is {name!r}, which is not in CACHES.",
            hint="Name one of your CACHES aliases (JOBGUARD['CACHE']['ALIAS'] defaults to 'default').",
            id="jobguard.E005",
        )
        for name, where in sorted(wanted.items())
        if name not in configured
    ]


#: PgBouncer's default port: an undeclared alias on it is most likely pooled (jobguard.W061).
PGBOUNCER_DEFAULT_PORT = "6432"


# Not tagged "database" either: these read DATABASES and never connect. A pooler cannot
# be detected over SQL (PgBouncer answers as the server), so aliases are declared in
# JOBGUARD["POOLED_DATABASES"]; only PgBouncer's default port is taken as a hint.
@checks.register()
def check_pooled_databases(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W060: a pooled alias with settings that break in transaction mode;
    W061: an alias on PgBouncer's port not declared pooled; W062: workers will poll, not LISTEN."""
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    return [*_pooled_settings_warnings(conf), *_pgbouncer_port_warnings(conf), *_listen_warnings(conf)]


def _pooled_settings_warnings(conf: Settings) -> list[checks.CheckMessage]:
    """jobguard.W060: pooled PostgreSQL aliases whose settings break in transaction mode."""
    messages: list[checks.CheckMessage] = []
    for alias in sorted(conf.pooled_databases):
        db = connections.settings[alias]
        if not db.get("ENGINE", "").endswith("postgresql"):
            continue
        problems = []
        if not db.get("DISABLE_SERVER_SIDE_CURSORS"):
            problems.append(
                "DISABLE_SERVER_SIDE_CURSORS is not True (server-side cursors outlive a transaction)"
            )
        if db.get("OPTIONS", {}).get("prepare_threshold", 5) is not None:
            problems.append(
                "OPTIONS['prepare_threshold'] is not None (psycopg prepares statements per session)"
            )
        if problems:
            messages.append(
                checks.Warning(
                    f"DATABASES[{alias!r}] is in JOBGUARD['POOLED_DATABASES'] but {'; '.join(problems)}.",
                    hint="Behind PgBouncer in transaction mode set 'DISABLE_SERVER_SIDE_CURSORS': True "
                    "and 'OPTIONS': {'prepare_threshold': None} (docs/how-to/scale-out.md).",
                    id="jobguard.W060",
                )
            )
    return messages


def _pgbouncer_port_warnings(conf: Settings) -> list[checks.CheckMessage]:
    """jobguard.W061: aliases on PgBouncer's default port that are not declared pooled."""
    messages: list[checks.CheckMessage] = []
    for alias, db in connections.settings.items():
        if str(db.get("PORT", "")) == PGBOUNCER_DEFAULT_PORT and alias not in conf.pooled_databases:
            if alias == conf.listen_database:
                continue  # declared as the direct connection: the operator knows what is there
            messages.append(
                checks.Warning(
                    f"DATABASES[{alias!r}] uses port {PGBOUNCER_DEFAULT_PORT}, PgBouncer's default, but "
                    "is not in JOBGUARD['POOLED_DATABASES'].",
                    hint="If it goes through a pooler in transaction mode, add it to "
                    "JOBGUARD['POOLED_DATABASES'] so jobguard keeps no session state on it. Undeclared, "
                    "the pooler is only found when a prepared statement first fails on it (that job's "
                    "ack fails and the job runs again); each process then sends text and logs a warning.",
                    id="jobguard.W061",
                )
            )
    return messages


def _listen_warnings(conf: Settings) -> list[checks.CheckMessage]:
    """jobguard.W062: the jobs' alias is pooled and no direct connection can LISTEN for it."""
    alias = conf.database_alias
    if alias not in conf.pooled_databases or alias not in connections.settings:
        return []
    listen = conf.listen_database
    reason = ""
    if not listen:
        reason = f"JOBGUARD['DATABASE_ALIAS'] {alias!r} is pooled and JOBGUARD['LISTEN_DATABASE'] is not set"
    elif connections.settings[listen].get("NAME") != connections.settings[alias].get("NAME"):
        # NOTIFY is delivered within one database only.
        reason = f"JOBGUARD['LISTEN_DATABASE'] {listen!r} names another database than {alias!r}"
    if not reason:
        return []
    return [
        checks.Warning(
            f"Workers poll every POLL_INTERVAL instead of waking on NOTIFY: {reason}.",
            hint="Add a DATABASES alias for the same database that bypasses the pooler and "
            "name it in JOBGUARD['LISTEN_DATABASE'].",
            id="jobguard.W062",
        )
    ]


@checks.register()
def check_durable_invalidation(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W020: durable invalidation is the default, but jobs live on another database.

    A durable invalidation inserts its job in the write's transaction, so the write must run
    on ``JOBGUARD["DATABASE_ALIAS"]``; ``invalidate()`` takes Django's default alias unless
    given ``using=``, and then raises.
    """
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    if not conf.cache.durable or conf.database_alias == DEFAULT_DB_ALIAS:
        return []
    return [
        checks.Warning(
            f"JOBGUARD['CACHE']['DURABLE'] is True, but JOBGUARD['DATABASE_ALIAS'] is "
            f"{conf.database_alias!r}: an invalidate() of a write on {DEFAULT_DB_ALIAS!r} cannot put "
            "its job in that write's transaction, and raises ValueError.",
            hint=f"Pass using={conf.database_alias!r} for writes on that database and durable=False "
            "for others, or leave JOBGUARD['CACHE']['DURABLE'] off and pass durable=True where it applies.",
            id="jobguard.W020",
        )
    ]


@checks.register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E010: bad cron or time zone; E011: unknown task or arguments that do not fit;
    W013: ticks closer than the task's expected duration; W014: a name declared twice."""
    try:
        declared = schedules.declared_schedules()
    except ImproperlyConfigured:
        return []
    messages: list[checks.CheckMessage] = []
    for name, spec in sorted(declared.items()):
        messages.extend(_schedule_messages(name, spec))
    return messages


def _schedule_where(name: str, spec: ScheduleConfig) -> str:
    """Where schedule ``name`` is declared, as its messages name it."""
    if spec.source == "code":
        return f"@task(schedule={spec.cron!r}) of {name}"
    return f"JOBGUARD['SCHEDULES'][{name!r}]"


def _schedule_messages(name: str, spec: ScheduleConfig) -> list[checks.CheckMessage]:
    """The W014, E010, E011 and W013 messages of one schedule, in that order."""
    messages: list[checks.CheckMessage] = []
    task = registry.find(spec.task)
    in_code = registry.find(name)
    if spec.source == "settings" and in_code is not None and in_code.schedule:
        messages.append(
            checks.Warning(
                f"Schedule {name!r} is declared by @task(schedule=...) and in JOBGUARD['SCHEDULES']; "
                "the settings entry is the one that runs.",
                hint="Keep one of the two declarations.",
                id="jobguard.W014",
            )
        )
    try:
        schedules.validate(spec.cron, spec.timezone)
    except InvalidScheduleError as exc:
        messages.append(
            checks.Error(
                f"{_schedule_where(name, spec)}: {exc}",
                hint="Use five cron fields (minute hour day month weekday), or six with seconds "
                "first, and an IANA time zone; see docs/how-to/recurring-jobs.md.",
                id="jobguard.E010",
            )
        )
        return messages
    problem = _schedule_task_problem(spec, task)
    if task is None or problem is not None:
        messages.append(
            checks.Error(
                f"{_schedule_where(name, spec)} {problem}.",
                hint="Name a function decorated with @task (in an app's tasks.py) by its dotted "
                "path; each tick enqueues it with the schedule's args and kwargs.",
                id="jobguard.E011",
            )
        )
        return messages
    messages.extend(_schedule_overlap(name, spec, task))
    return messages


def _schedule_task_problem(spec: ScheduleConfig, task: Task | None) -> str | None:
    """Why the schedule cannot enqueue its task (unregistered, arguments that do not fit), or None."""
    if task is None:
        return f"names task {spec.task!r}, which is not registered"
    try:
        task.bind(spec.args, spec.kwargs)
    except InvalidArgumentsError as exc:
        return f"has args/kwargs that do not fit the task: {str(exc).rstrip('.')}"
    return None


def _schedule_overlap(name: str, spec: ScheduleConfig, task: Task) -> list[checks.CheckMessage]:
    """jobguard.W013: the schedule ticks more often than its task is expected to run."""
    # Until (and unless) @task takes expected_duration=, tasks simply have none.
    expected = getattr(task, "expected_duration", None)
    if not expected:
        return []
    start = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    interval = schedules.shortest_interval(spec.cron, spec.timezone, start)
    if interval < expected:
        return [
            checks.Warning(
                f"{_schedule_where(name, spec)} ticks every {interval:g}s, but {task.name} is expected "
                f"to run for {expected:g}s: runs will pile up behind each other.",
                hint="Tick less often, or give the task a lock= so runs cannot overlap.",
                id="jobguard.W013",
            )
        ]
    return []


def check_tasks_backend(alias: str, queues: set[str]) -> list[checks.CheckMessage]:
    """jobguard.E013: JobGuardBackend without the app; W017: a TASKS queue JOBGUARD does not configure.

    Not registered here: ``JobGuardBackend.check()`` calls it for each of its ``TASKS`` aliases,
    and Django runs the backends' checks.
    """
    if not apps.is_installed("django_jobguard"):
        return [
            checks.Error(
                f"TASKS[{alias!r}] uses JobGuardBackend, but django_jobguard is not in INSTALLED_APPS.",
                hint="Add 'django_jobguard' to INSTALLED_APPS and run migrate.",
                id="jobguard.E013",
            )
        ]
    try:
        configured = set(get_settings().queues)
    except ImproperlyConfigured:
        return []  # jobguard.E001 reports it
    if not configured:
        return []
    return [
        checks.Warning(
            f"TASKS[{alias!r}]['QUEUES'] lists {name!r}, which JOBGUARD['QUEUES'] does not configure: "
            "its jobs get the global visibility timeout and retry schedule.",
            hint=f"Add {name!r} to JOBGUARD['QUEUES'], or remove it from TASKS[{alias!r}]['QUEUES'].",
            id="jobguard.W017",
        )
        for name in sorted(queues - configured)
    ]


@checks.register()
def check_api(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W040: tasks are declared ``@task(api=True)`` but Django REST framework is not installed."""
    exposed = [name for name in registry.names() if registry.get(name).api]
    if not exposed or apps.is_installed("rest_framework"):
        return []
    return [
        checks.Warning(
            f"{len(exposed)} task(s) are declared @task(api=True) (such as {exposed[0]!r}), but "
            "'rest_framework' is not in INSTALLED_APPS, so nothing can enqueue them over HTTP.",
            hint='pip install "django-jobguard[api]", add "rest_framework" to INSTALLED_APPS and mount '
            'path("jobguard/api/", include("django_jobguard.api.urls")); or drop api=True.',
            id="jobguard.W040",
        )
    ]


# -- the checklist: task classification and timeouts -----------------------------------------
# These read the registered tasks and the settings only (never the database), so they run
# with every command, like the ones above. The observed-duration checks below need the
# database and are tagged for it.


def _tasks() -> list[Any]:

    return [task for name in registry.names() if (task := registry.find(name)) is not None]


def _queue_of(task: Any, conf: Any) -> str:
    return str(task.queue_name or conf.default_queue)


def _timeout_of(task: Any, conf: Any) -> float:
    return float(task.visibility_timeout or conf.queue(_queue_of(task, conf)).visibility_timeout)


@checks.register()
def check_task_classification(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W002: unclassified task; W003: retried on every error; W007: lock TTL too short."""
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    messages: list[checks.CheckMessage] = []
    for task in _tasks():
        if task.idempotent is None and task.idempotency_key_template is None:
            messages.append(
                checks.Warning(
                    "Unclassified: is it safe to run twice? Every job may run "
                    "more than once (a crash between the work and the ack runs it again).",
                    hint="Declare @task(idempotent=True) if running twice has the effect of once, "
                    "idempotency_key='action:{param}' to dedupe by business identity, or "
                    "idempotent=False if you accept or handle duplicates.",
                    obj=task,
                    id="jobguard.W002",
                )
            )
        attempts = task.max_attempts or conf.queue(_queue_of(task, conf)).max_attempts
        classified = task.retry_on or task.recoverable_on or task.fatal_on
        if attempts > 1 and not classified and conf.unclassified_errors == "transient":
            messages.append(
                checks.Warning(
                    f"{attempts} attempts and no error classification: every "
                    "exception, a bug included, is retried as transient.",
                    hint="Map your exceptions: retry_on= what another try can fix, recoverable_on= "
                    "a degraded dependency, fatal_on= bad data and bugs; or set max_attempts=1.",
                    obj=task,
                    id="jobguard.W003",
                )
            )
        margin = conf.tuning.heartbeat_margin
        if task.lock is not None:
            ttl = float(task.lock_ttl or conf.locks.ttl)
            if ttl < 2 * margin:
                messages.append(
                    checks.Warning(
                        f"Lock TTL of {ttl:g}s, shorter than two heartbeat "
                        f"margins ({2 * margin:g}s): one heartbeat that comes late in a slow moment "
                        "loses the lock, and the job's ack is refused.",
                        hint=f"Set lock_ttl={2 * margin:g} or more (JOBGUARD['LOCKS']['TTL'] for "
                        "every task); the heartbeat renews the lock every third of its TTL.",
                        obj=task,
                        id="jobguard.W007",
                    )
                )
    return messages


@checks.register()
def check_expected_durations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W004: a visibility timeout below expected_duration + margin; W006: mixed queue."""
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []

    messages: list[checks.CheckMessage] = []
    by_queue: dict[str, dict[str, float]] = {}
    for task in _tasks():
        if task.expected_duration is None:
            continue
        expected = float(task.expected_duration)
        queue = _queue_of(task, conf)
        by_queue.setdefault(queue, {})[task.name] = expected
        timeout = _timeout_of(task, conf)
        needed = expected + conf.tuning.heartbeat_margin
        if timeout < needed:
            recommended, reason = recommend_timeout(expected, conf)
            messages.append(
                checks.Warning(
                    f"Expected duration {expected:g}s, but the visibility timeout is "
                    f"{timeout:g}s, below {needed:g}s (expected duration + heartbeat margin): a "
                    "heartbeat that stalls lets a normal run reappear on another worker.",
                    hint=f"Set visibility_timeout={recommended:g} on the task or its queue "
                    f"JOBGUARD['QUEUES'][{queue!r}] ({reason}).",
                    obj=task,
                    id="jobguard.W004",
                )
            )
    messages += _mixed_queues(by_queue, conf, source="expected")
    return messages


def _mixed_queues(
    by_queue: dict[str, dict[str, float]], conf: Any, *, source: str
) -> list[checks.CheckMessage]:

    messages: list[checks.CheckMessage] = []
    factor = conf.tuning.queue_split_factor
    for queue, durations in sorted(by_queue.items()):
        spread = split_needed(durations.values(), factor)
        if spread is None:
            continue
        slowest = max(durations, key=lambda name: durations[name])
        fastest = min(durations, key=lambda name: durations[name])
        messages.append(
            checks.Warning(
                f"Queue {queue!r} mixes fast and slow work: {fastest} {source} "
                f"{durations[fastest]:.3g}s, {slowest} {durations[slowest]:.3g}s, more than "
                f"{factor:g}x apart. Slow jobs take the worker slots the fast ones wait for, and "
                "one visibility timeout cannot fit both.",
                hint=f"Move {slowest} to a queue of its own (@task(queue_name=...)) with its own "
                "workers and visibility timeout; the factor is JOBGUARD['TUNING']['QUEUE_SPLIT_FACTOR'].",
                obj=registry.find(slowest) or slowest,
                id="jobguard.W006",
            )
        )
    return messages


@checks.register(checks.Tags.database)
def check_observed_durations(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """jobguard.W005: recent runs outlast their visibility timeout; W006 from observed durations.

    Tagged ``database``: Django runs it only for ``check --database ALIAS`` (and ``migrate``),
    since it reads the job table.
    """
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    alias = conf.database_alias
    if not databases or alias not in databases:
        return []
    try:
        observed = observed_durations(alias, since=conf.tuning.window)
    except DatabaseError:
        return []  # not migrated yet (check runs before migrate): nothing observed
    messages: list[checks.CheckMessage] = []
    by_queue: dict[str, dict[str, float]] = {}
    hours = conf.tuning.window / 3600
    for durations in observed:
        if durations.count < conf.tuning.min_runs:
            continue
        by_queue.setdefault(durations.queue, {})[durations.task] = durations.p99
        timeout = task_timeout(durations.task, durations.queue, conf)
        if durations.p99 > timeout:
            recommended, reason = recommend_timeout(durations.p99, conf)
            messages.append(
                checks.Warning(
                    f"{durations.count} runs in the last {hours:g}h with a "
                    f"p99 of {durations.p99:.3g}s (max {durations.max:.3g}s), above its visibility "
                    f"timeout of {timeout:g}s: a heartbeat that stalls lets such runs reappear.",
                    hint=f"Set visibility_timeout={recommended:g} on the task or queue "
                    f"JOBGUARD['QUEUES'][{durations.queue!r}] ({reason}); "
                    "see manage.py jobguard_tune.",
                    obj=registry.find(durations.task) or durations.task,
                    id="jobguard.W005",
                )
            )
    return messages + _mixed_queues(by_queue, conf, source="observed p99")


@checks.register(checks.Tags.database)
def check_mysql_server(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """jobguard.E052-E057: a MariaDB/MySQL server or session that cannot hold the job store.

    Tagged ``database``: Django runs it for ``check --database ALIAS`` and ``migrate``.
    """
    try:
        alias = get_settings().database_alias
    except ImproperlyConfigured:
        return []
    if not databases or alias not in databases or connections[alias].vendor != "mysql":
        return []
    try:
        return _mysql_server(alias)
    except DatabaseError as exc:
        return [
            checks.Warning(
                f"Could not inspect the MariaDB/MySQL server of {alias!r}: {exc}",
                hint="Run manage.py check --database again once the server answers.",
                id="jobguard.W050",
            )
        ]


def _mysql_server(alias: str) -> list[checks.CheckMessage]:
    connection: Any = connections[alias]
    messages: list[checks.CheckMessage] = []
    version = ".".join(str(part) for part in connection.mysql_version)
    if connection.mysql_is_mariadb:
        product, too_old = "MariaDB", connection.mysql_version < (10, 6)
    else:
        product, too_old = "MySQL", connection.mysql_version < (8, 0, 1)
    if too_old or not connection.features.has_select_for_update_skip_locked:
        messages.append(
            checks.Error(
                f"{alias!r} is {product} {version}, which has no SELECT ... FOR UPDATE SKIP LOCKED: "
                "concurrent workers would queue behind one another's claims.",
                hint="Upgrade to MariaDB 10.6 or later, or MySQL 8.0 or later.",
                id="jobguard.E052",
            )
        )
    with connection.cursor() as cursor:
        variable = "@@transaction_isolation" if not connection.mysql_is_mariadb else "@@tx_isolation"
        cursor.execute(
            f"SELECT {variable}, @@log_bin, @@binlog_format, TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), NOW())"
        )
        isolation, log_bin, binlog_format, offset = cursor.fetchone()
        cursor.execute(
            "SELECT table_name, engine, table_collation FROM information_schema.tables "
            "WHERE table_schema = DATABASE() AND table_name LIKE %s ORDER BY table_name",
            ["jobguard\\_%"],
        )
        tables = cursor.fetchall()
    if str(isolation).upper().replace("-", " ") != "READ COMMITTED":
        messages.append(
            checks.Error(
                f"{alias!r}'s sessions run at {isolation}: InnoDB then takes gap and next-key "
                "locks, so concurrent enqueues, claims and deletes deadlock one another.",
                hint=f"Set {MYSQL_OPTIONS_HINT}, and no init_command that changes the level.",
                id="jobguard.E057",
            )
        )
    if int(log_bin or 0) and str(binlog_format).upper() == "STATEMENT":
        messages.append(
            checks.Error(
                f"{alias!r} writes its binary log with binlog_format=STATEMENT: the claim's "
                "UUID() lease tokens and SKIP LOCKED are unsafe to replay on a replica, which "
                "would diverge.",
                hint="Set binlog_format=ROW (or MIXED, which logs those statements as rows) in "
                "the server's configuration.",
                id="jobguard.E053",
            )
        )
    myisam = [name for name, engine, _ in tables if str(engine).lower() != "innodb"]
    if myisam:
        messages.append(
            checks.Error(
                f"The tables {', '.join(myisam)} of {alias!r} are not InnoDB: without row locks "
                "and transactions, claims, fencing and atomic acks do not hold.",
                hint="ALTER TABLE <name> ENGINE=InnoDB for each (and set "
                "default_storage_engine=InnoDB on the server).",
                id="jobguard.E054",
            )
        )
    narrow = [name for name, _, collation in tables if not str(collation).lower().startswith("utf8mb4")]
    if narrow:
        messages.append(
            checks.Error(
                f"The tables {', '.join(narrow)} of {alias!r} are not utf8mb4: arguments, "
                "errors and keys with characters outside the Basic Multilingual Plane fail.",
                hint="ALTER TABLE <name> CONVERT TO CHARACTER SET utf8mb4 for each, and create "
                "the database with CHARACTER SET utf8mb4.",
                id="jobguard.E055",
            )
        )
    if offset:
        messages.append(
            checks.Error(
                f"{alias!r}'s sessions are {offset} seconds away from UTC: the columns that "
                "default to CURRENT_TIMESTAMP (due and enqueue times) would be off by as much.",
                hint=f"Set {MYSQL_OPTIONS_HINT} (Django writes UTC under USE_TZ).",
                id="jobguard.E056",
            )
        )
    return messages


@checks.register(checks.Tags.security)
def check_replay_approval(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W008: the replay two-person rule is off in production (DEBUG=False)."""
    try:
        replay = get_settings().replay
    except ImproperlyConfigured:
        return []
    if replay.allow_self_approval and not settings.DEBUG:
        return [
            checks.Warning(
                "JOBGUARD['REPLAY']['ALLOW_SELF_APPROVAL'] is True while DEBUG is False: one "
                "person can request and approve the replay of a dead letter (a payment, an "
                "e-mail) alone.",
                hint="Remove ALLOW_SELF_APPROVAL (the default, False) so a second person approves "
                "every replay; keep it for development and demos only.",
                id="jobguard.W008",
            )
        ]
    return []


@checks.register()
def check_task_queues(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E030: a task's ``queue_name`` is not declared in ``JOBGUARD["QUEUES"]``.

    ``@task`` runs at import time, before settings may be read, so its queue is checked
    here (and again at each enqueue, which refuses it).
    """
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    messages: list[checks.CheckMessage] = []
    for name in registry.names():
        queue_name = registry.get(name).queue_name
        if queue_name is None or conf.undeclared_queue(queue_name) is None:
            continue
        messages.append(
            checks.Error(
                f"Task {name} names queue {queue_name!r}, which JOBGUARD['QUEUES'] does not declare; "
                "its enqueues are refused.",
                hint=f"Declare it in JOBGUARD['QUEUES'] (known queues: {', '.join(conf.known_queues)}), "
                "fix the task's queue_name, or set JOBGUARD['ALLOW_UNDECLARED_QUEUES'] = True.",
                id="jobguard.E030",
            )
        )
    return messages


@checks.register()
def check_task_limits(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E031: a task's ``limit=`` names no entry of ``JOBGUARD["LIMITS"]``.

    ``@task`` runs at import time, before settings may be read, so the name is checked
    here; the worker runs the system checks when it starts, so such a task never runs.
    """
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    messages: list[checks.CheckMessage] = []
    for name in registry.names():
        limit = getattr(registry.get(name), "limit", None)
        if limit is None or limit in conf.limits:
            continue
        messages.append(
            checks.Error(
                f"Task {name} has limit={limit!r}, which JOBGUARD['LIMITS'] does not declare.",
                hint=f"Declare it, e.g. JOBGUARD['LIMITS'][{limit!r}] = "
                "{'rate': '25/s', 'concurrency': 10} "
                f"(declared limits: {', '.join(sorted(conf.limits)) or 'none'}), or fix the name.",
                id="jobguard.E031",
            )
        )
    return messages


@checks.register()
def check_flow_control_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E032: flow-control limits declared while the job store is MariaDB/MySQL.

    The limited claim is built for PostgreSQL and SQLite only; a worker on MariaDB/MySQL would
    otherwise run limited tasks without their limits.
    """
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    vendor = connections[conf.database_alias].vendor if conf.database_alias in connections else ""
    if vendor != "mysql":
        return []
    from . import store

    plan = store.flow_plan()
    if plan is None:
        return []
    return [
        checks.Error(
            "Flow-control limits are declared (task concurrency=, rate= or limit=, JOBGUARD['LIMITS'], "
            "or a queue's concurrency), but the job store is MariaDB/MySQL, which does not enforce "
            "them yet.",
            hint="Use PostgreSQL or SQLite as JOBGUARD['DATABASE_ALIAS'], or remove the limits "
            "(docs/how-to/choose-a-database.md).",
            id="jobguard.E032",
        )
    ]
