"""Checks of the registered tasks: queues, limits, timeouts and the checklist's classification."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from ..conf import get_settings
from ..monitoring.tuning import observed_durations, recommend_timeout, split_needed, task_timeout
from ..registry import registry
from ..retry import TRANSIENT

if TYPE_CHECKING:
    pass


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
    """jobguard.W002: unclassified task; W007: lock TTL too short."""
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


#: The tag of the checklist's checks that are shown at deploy time (``manage.py check --deploy``)
#: and by each worker as it starts, not by every command: one line per task that most tasks of
#: a new project (or one moved from Celery) get, printed by runserver, migrate and shell alike.
WORKER_START_TAG = "jobguard_worker"


@checks.register(WORKER_START_TAG, deploy=True)
def check_retry_classification(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W003: a task retried on every error (none of its exceptions classified)."""
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    if conf.unclassified_errors != TRANSIENT:
        return []
    messages: list[checks.CheckMessage] = []
    for task in _tasks():
        attempts = task.max_attempts or conf.queue(_queue_of(task, conf)).max_attempts
        if attempts > 1 and not (task.retry_on or task.recoverable_on or task.fatal_on):
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
def check_unused_breakers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W033: a breaker or retry budget in ``JOBGUARD["LIMITS"]`` that no task names.

    A breaker guards the tasks declared with ``@task(limit=name)``; with none, it never
    opens and guards nothing, which is most often a misspelt name on the tasks' side.
    """
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    named = {getattr(registry.get(name), "limit", None) for name in registry.names()}
    # An outbox destination's LIMIT guards its sends as a task's limit= guards its jobs.
    named |= {destination.limit for destination in conf.outbox.destinations.values()}
    messages: list[checks.CheckMessage] = []
    for name, limit in sorted(conf.limits.items()):
        if (limit.breaker is None and limit.retry_budget is None) or name in named:
            continue
        what = " and ".join(
            part
            for part, spec in (("a breaker", limit.breaker), ("a retry budget", limit.retry_budget))
            if spec is not None
        )
        messages.append(
            checks.Warning(
                f"JOBGUARD['LIMITS'][{name!r}] declares {what}, but no task names it with limit={name!r} "
                "and no outbox destination with 'LIMIT': it guards nothing.",
                hint=f"Declare the dependency's tasks with @task(limit={name!r}) (or its outbox "
                f"destinations with 'LIMIT': {name!r}), or remove the entry.",
                id="jobguard.W033",
            )
        )
    return messages


@checks.register()
def check_long_atomic_tasks(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W064: an ``atomic=True`` task may run past ``HORIZON["ATOMIC_TIMEOUT"]``.

    Its transaction is open for the whole run, and holds PostgreSQL's vacuum horizon (every
    database of the cluster) meanwhile. Judged by its ``timeout``, else its ``expected_duration``;
    a task with neither is left to the worker's gauge of its longest open job transaction.
    """
    try:
        bound = get_settings().horizon.atomic_timeout
    except ImproperlyConfigured:
        return []
    messages: list[checks.CheckMessage] = []
    for task in _tasks():
        if not task.atomic:
            continue
        runs, option = (
            (task.timeout, "timeout") if task.timeout else (task.expected_duration, "expected_duration")
        )
        if not runs or runs <= bound:
            continue
        messages.append(
            checks.Warning(
                f"atomic=True with {option}={runs:g}s, over JOBGUARD['HORIZON']['ATOMIC_TIMEOUT'] "
                f"({bound:g}s): its job's transaction stays open for the whole run, and meanwhile no "
                "dead row of the cluster can be vacuumed (the job queue's own included, so claims "
                "slow down).",
                hint="Use atomic=False with an idempotency key (idempotency_key='...', or "
                "idempotent=True with effects that are safe to repeat), so each write commits on "
                "its own; or split the work into shorter jobs (a chain or a batch). "
                "See docs/runbooks/vacuum-horizon-held.md.",
                obj=task,
                id="jobguard.W064",
            )
        )
    return messages
