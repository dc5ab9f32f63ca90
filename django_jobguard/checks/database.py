"""Checks of the job store's database: vendor and options, MariaDB/MySQL's server, poolers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.db.migrations.recorder import MigrationRecorder

from .. import store
from ..conf import Settings, get_settings
from ..store.horizon import autovacuum_off, server_timeouts

if TYPE_CHECKING:
    pass


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


#: PgBouncer's default port: an undeclared alias on it is most likely pooled (jobguard.W061).
PGBOUNCER_DEFAULT_PORT = "6432"


# Not tagged "database" either: these read DATABASES and never connect. A pooler cannot
# be detected over SQL (PgBouncer answers as the server), so aliases are declared in
# JOBGUARD["POOLED_DATABASES"]; only PgBouncer's default port is taken as a hint.
@checks.register()
def check_pooled_databases(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W060: a pooled alias with settings that break in transaction mode;
    W061: an alias on PgBouncer's port not declared pooled; W062: workers will poll, not LISTEN;
    W066: with NOTIFY "none" and no WAKEUP_CACHE, workers poll too rarely."""
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    return [
        *_pooled_settings_warnings(conf),
        *_pgbouncer_port_warnings(conf),
        *_listen_warnings(conf),
        *_notify_none_warnings(conf),
    ]


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
                    "the pooler is only found when a prepared statement fails on it (up to once per "
                    "connection: the transaction runs again, an atomic job at once without using an "
                    "attempt); each process then sends text and logs a warning.",
                    id="jobguard.W061",
                )
            )
    return messages


def _listen_warnings(conf: Settings) -> list[checks.CheckMessage]:
    """jobguard.W062: the jobs' alias is pooled and no direct connection can LISTEN for it."""
    alias = conf.database_alias
    if alias not in conf.pooled_databases or alias not in connections.settings or conf.wakeup_cache:
        return []  # (with WAKEUP_CACHE, Redis wakes the workers instead)
    if conf.notify == "none":
        return []  # nothing to LISTEN for: W066 judges the polling
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
            "name it in JOBGUARD['LISTEN_DATABASE'], or wake them through Redis with "
            "JOBGUARD['WAKEUP_CACHE'].",
            id="jobguard.W062",
        )
    ]


#: Seconds of POLL_INTERVAL past which, with NOTIFY "none" and no WAKEUP_CACHE, a new job waits
#: too long for an idle worker (jobguard.W066): the package's default poll is 1 s.
NOTIFY_NONE_MAX_POLL_SECONDS = 1.0


def _notify_none_warnings(conf: Settings) -> list[checks.CheckMessage]:
    """jobguard.W066: no NOTIFY, no Redis, and a poll interval that leaves new jobs waiting."""
    alias = conf.database_alias
    if conf.notify != "none" or conf.wakeup_cache or alias not in connections.settings:
        return []
    if connections[alias].vendor != "postgresql" or conf.poll_interval <= NOTIFY_NONE_MAX_POLL_SECONDS:
        return []
    return [
        checks.Warning(
            f"An idle worker finds a new job up to {conf.poll_interval:g} s after its enqueue: "
            "JOBGUARD['NOTIFY'] is 'none', JOBGUARD['WAKEUP_CACHE'] is not set, and workers poll "
            f"every POLL_INTERVAL ({conf.poll_interval:g} s).",
            hint="Set JOBGUARD['NOTIFY'] to 'coalesced' (at most one NOTIFY per queue per process "
            "every NOTIFY_INTERVAL, outside the application's commits), wake the workers through Redis "
            f"with JOBGUARD['WAKEUP_CACHE'], or set POLL_INTERVAL to {NOTIFY_NONE_MAX_POLL_SECONDS:g} s "
            "or less (each idle worker claims once per interval).",
            id="jobguard.W066",
        )
    ]


@checks.register(checks.Tags.database)
def check_notify_mode(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """jobguard.W067: the jobs' PostgreSQL database runs another NOTIFY mode than JOBGUARD["NOTIFY"].

    Tagged ``database``: Django runs it for ``check --database ALIAS`` and ``migrate`` (which
    then installs the setting).
    """
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    alias = conf.database_alias
    if not databases or alias not in databases or connections[alias].vendor != "postgresql":
        return []
    try:
        installed = store.installed_notify_mode(alias)
    except DatabaseError:
        return []  # the other database checks report a server that does not answer
    if installed is None or installed == conf.notify:
        return []
    if installed == "row":
        meanwhile = "every enqueuing commit still notifies, and waits its turn on PostgreSQL's notify lock."
    elif conf.notify == "row":
        meanwhile = "no one notifies a new job: idle workers find it at their next poll."
    else:
        meanwhile = "a job put back in the queue is notified as the database's mode says."
    return [
        checks.Warning(
            f"The database of {alias!r} runs the NOTIFY mode {installed!r}, but JOBGUARD['NOTIFY'] "
            f"is {conf.notify!r}: {meanwhile}",
            hint="Run manage.py migrate: it installs the setting in the database (it replaces the "
            "function jobguard_notify_mode(), which takes no lock on the jobs table).",
            id="jobguard.W067",
        )
    ]


#: The columns that identify something (keys, scopes, names, tokens): MariaDB/MySQL must
#: compare them with a NO PAD binary collation, byte for byte as PostgreSQL does (migration
#: 0022, whose list this is). Free text (task and workflow names, errors, notes) is not here.
KEY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("jobguard_idempotencykey", "key"),
    ("jobguard_idempotencykey", "scope"),
    ("jobguard_lock", "key"),
    ("jobguard_lock", "token"),
    ("jobguard_job", "idempotency_key"),
    ("jobguard_job", "queue_name"),
    ("jobguard_job", "worker_id"),
    ("jobguard_job", "lock_key"),
    ("jobguard_job", "lease_token"),
    ("jobguard_deadletter", "queue_name"),
    ("jobguard_deadletter", "worker_id"),
    ("jobguard_deadletter", "idempotency_key"),
    ("jobguard_deadletter", "lock_key"),
    ("jobguard_lockrelease", "key"),
    ("jobguard_schedule", "name"),
    ("jobguard_schedule", "queue_name"),
    ("jobguard_queuestate", "queue_name"),
    ("jobguard_queueevent", "queue_name"),
    ("jobguard_queueminute", "queue_name"),
    ("jobguard_workerbeat", "worker_id"),
    ("jobguard_flowrate", "key"),
    ("jobguard_breaker", "name"),
    ("jobguard_breakerevent", "name"),
    # Migration 0030's: the outbox's destinations, keys and lease tokens.
    ("jobguard_outboxmessage", "destination"),
    ("jobguard_outboxmessage", "key"),
    ("jobguard_outboxkey", "destination"),
    ("jobguard_outboxkey", "key"),
    ("jobguard_outboxcursor", "destination"),
    ("jobguard_outboxcursor", "key"),
    ("jobguard_outboxcursor", "lease_token"),
)
#: utf8mb4's NO PAD binary collations: MariaDB's (10.2+) and MySQL's (8.0.17+).
NO_PAD_BINARY_COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin")
#: The migration that gives KEY_COLUMNS their collation; before it is applied they are expected
#: to pad (``migrate`` runs this check first, and must not be refused for what it will fix).
KEY_COLLATION_MIGRATION = ("jobguard", "0022_mysql_no_pad_keys")


def _padded_key_columns(connection: Any, cursor: Any) -> list[str]:
    """``table.column (collation)`` of each key column that is not NO PAD binary (jobguard.E058)."""
    if KEY_COLLATION_MIGRATION not in MigrationRecorder(connection).applied_migrations():
        return []
    cursor.execute(
        "SELECT table_name, column_name, collation_name FROM information_schema.columns "
        "WHERE table_schema = DATABASE() AND table_name LIKE %s",
        ["jobguard\\_%"],
    )
    collations = {(str(table), str(column)): str(collation) for table, column, collation in cursor.fetchall()}
    return [
        f"{table}.{column} ({collations[table, column]})"
        for table, column in KEY_COLUMNS
        if (table, column) in collations and collations[table, column].lower() not in NO_PAD_BINARY_COLLATIONS
    ]


def _checked_jobs_alias(databases: Any, vendor: str) -> str | None:
    """The jobs' alias when a database-tagged check should read it: asked for (``check
    --database``, ``migrate``) and on ``vendor``'s server; None otherwise."""
    try:
        alias = get_settings().database_alias
    except ImproperlyConfigured:
        return None
    if not databases or alias not in databases or connections[alias].vendor != vendor:
        return None
    return alias


@checks.register(checks.Tags.database)
def check_mysql_server(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """jobguard.E052-E058: a MariaDB/MySQL server or session that cannot hold the job store.

    Tagged ``database``: Django runs it for ``check --database ALIAS`` and ``migrate``.
    """
    alias = _checked_jobs_alias(databases, "mysql")
    if alias is None:
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
        padded = _padded_key_columns(connection, cursor)
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
    if padded:
        messages.append(
            checks.Error(
                f"The key columns {', '.join(padded)} of {alias!r} do not compare exactly: under "
                "a PAD SPACE collation (utf8mb4_bin) 'welcome:alice' and 'welcome:alice ' are one "
                "idempotency key, and two lock keys, rate keys or queue names that differ so are "
                "merged; under a case-insensitive one, 'Alice' and 'alice' are.",
                hint="Give each column back the NO PAD binary collation migration 0022 gave it "
                "(utf8mb4_nopad_bin on MariaDB, utf8mb4_0900_bin on MySQL): python manage.py "
                "sqlmigrate jobguard 0022 prints the statements.",
                id="jobguard.E058",
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


@checks.register(checks.Tags.database)
def check_transaction_timeouts(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """jobguard.W063: the jobs' PostgreSQL connections have no idle_in_transaction_session_timeout
    (nor, on PostgreSQL 17 and later, transaction_timeout).

    Tagged ``database``: Django runs it for ``check --database ALIAS`` and ``migrate``.
    """
    alias = _checked_jobs_alias(databases, "postgresql")
    if alias is None:
        return []
    try:
        timeouts = server_timeouts(alias) or {}
    except DatabaseError:
        return []  # the other database checks report a server that does not answer
    unset = [name for name, value in sorted(timeouts.items()) if not value]
    if not unset:
        return []
    return [
        checks.Warning(
            f"{' and '.join(unset)} {'is' if len(unset) == 1 else 'are'} off (0) for the connections of "
            f"{alias!r}: a session of theirs left in a transaction (a crashed handler's, a shell's) "
            "holds the cluster's vacuum horizon until someone ends it, and every claim slows down.",
            hint="Set it above the longest pause between two queries of an atomic task's handler "
            "(and, for transaction_timeout, above its longest run), for example "
            "'OPTIONS': {'options': '-c idle_in_transaction_session_timeout=60s'} in DATABASES, or "
            "ALTER ROLE ... SET for the jobs' role; set them for the other roles of the cluster too. "
            "See docs/runbooks/vacuum-horizon-held.md.",
            id="jobguard.W063",
        )
    ]


@checks.register(checks.Tags.database)
def check_autovacuum(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """jobguard.W069: autovacuum cannot reach the jobs table (off on the server, or on the table).

    Tagged ``database``: Django runs it for ``check --database ALIAS`` and ``migrate``.
    """
    alias = _checked_jobs_alias(databases, "postgresql")
    if alias is None:
        return []
    from ..models import Job  # app registry: checks are imported while apps load

    try:
        off = autovacuum_off(alias, Job._meta.db_table)
    except DatabaseError:
        return []  # the other database checks report a server that does not answer
    if not off:
        return []
    return [
        checks.Warning(
            f"Autovacuum does not reach the jobs table of {alias!r} ({', '.join(off)}): every finished, "
            "pruned or retried job leaves a dead row that nothing reclaims, so the table and its "
            "indexes only grow and claims read further past them.",
            hint="Turn it back on (ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf(); or "
            "ALTER TABLE jobguard_job RESET (autovacuum_enabled)), or VACUUM the jobguard tables on a "
            "schedule. See docs/how-to/keep-the-queue-fast.md.",
            id="jobguard.W069",
        )
    ]
