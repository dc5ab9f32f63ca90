import importlib

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection, models

from django_jobguard import checks
from django_jobguard.migrations import _operations


@pytest.mark.django_db
def test_models_and_migrations_agree():
    call_command("makemigrations", "jobguard", "--check", "--dry-run", verbosity=0)


# -- the key columns' collation (migration 0022, check jobguard.E058) -------------------------

KEY_MIGRATION = importlib.import_module("django_jobguard.migrations.0022_mysql_no_pad_keys")
#: Later migrations that create key columns give them the collation themselves.
LATER_KEY_MIGRATIONS = [importlib.import_module("django_jobguard.migrations.0030_outbox")]
KEY_MIGRATION_COLUMNS = [column for m in (KEY_MIGRATION, *LATER_KEY_MIGRATIONS) for column in m.COLUMNS]

#: The app's text columns that are not keys, and why: free text (searched ignoring case on
#: MariaDB/MySQL), or values only this package writes, from a fixed set or as hex digests.
NOT_KEYS = {
    ("jobguard_job", "task_name"): "free text: the console searches it ignoring case",
    ("jobguard_job", "status"): "a fixed set",
    ("jobguard_job", "handler_version"): "a label",
    ("jobguard_idempotencykey", "fingerprint"): "a hex digest this package writes",
    ("jobguard_idempotencykey", "status"): "a fixed set",
    ("jobguard_deadletter", "task_name"): "free text",
    ("jobguard_deadletter", "reason"): "a fixed set",
    ("jobguard_deadletter", "category"): "a fixed set",
    ("jobguard_deadletter", "error_class"): "free text",
    ("jobguard_deadletter", "handler_version"): "a label",
    ("jobguard_deadletter", "replay_state"): "a fixed set",
    ("jobguard_replayevent", "action"): "a fixed set",
    ("jobguard_replayevent", "actor_name"): "free text",
    ("jobguard_schedule", "task_name"): "free text",
    ("jobguard_schedule", "cron"): "free text",
    ("jobguard_schedule", "timezone"): "a zone name, looked up by Python",
    ("jobguard_schedule", "missed"): "a fixed set",
    ("jobguard_schedule", "source"): "a fixed set",
    ("jobguard_queuestate", "changed_by_name"): "free text",
    ("jobguard_queueevent", "action"): "a fixed set",
    ("jobguard_queueevent", "actor_name"): "free text",
    ("jobguard_workerbeat", "host"): "free text",
    ("jobguard_workerbeat", "queues"): "a list, split by Python",
    ("jobguard_lockrelease", "actor_name"): "free text",
    ("jobguard_workflow", "kind"): "a fixed set",
    ("jobguard_workflow", "state"): "a fixed set",
    ("jobguard_workflow", "name"): "free text",
    ("jobguard_workflowcallback", "when"): "a fixed set",
    ("jobguard_jobdependency", "result_as"): "an argument name",
    ("jobguard_breaker", "state"): "a fixed set",
    ("jobguard_breaker", "changed_by_name"): "free text",
    ("jobguard_breakerevent", "from_state"): "a fixed set",
    ("jobguard_breakerevent", "to_state"): "a fixed set",
    ("jobguard_breakerevent", "actor_name"): "free text",
    ("jobguard_replayratechange", "actor_name"): "free text",
    ("jobguard_outboxmessage", "state"): "a fixed set",
    ("jobguard_outboxmessage", "resolution"): "a fixed set",
    ("jobguard_outboxmessage", "resolved_by"): "free text",
}


def _char_fields():
    for model in apps.get_app_config("jobguard").get_models():
        for field in model._meta.local_fields:
            if isinstance(field, models.CharField):
                yield (model._meta.db_table, field.column), field


def test_every_text_column_is_a_key_compared_exactly_or_named_as_free_text():
    # A new column that identifies something must join migration 0022's list (in a migration
    # of its own) and the check's; one that does not must say why here.
    key_columns = {(table, column) for table, column, _, _ in KEY_MIGRATION_COLUMNS}
    assert set(checks.database.KEY_COLUMNS) == key_columns
    assert key_columns.isdisjoint(NOT_KEYS)
    assert {column for column, _ in _char_fields()} == key_columns | set(NOT_KEYS)


def test_the_key_migration_declares_each_column_as_its_model_does():
    fields = dict(_char_fields())
    for table, column, length, null in KEY_MIGRATION_COLUMNS:
        assert (fields[table, column].max_length, fields[table, column].null) == (length, null), column
    assert checks.database.NO_PAD_BINARY_COLLATIONS == _operations.NO_PAD_BINARY_COLLATIONS


def _key_collations():
    if connection.vendor != "mysql":
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name LIKE %s",
            ["jobguard\\_%"],
        )
        rows = {(table, column): collation for table, column, collation in cursor.fetchall()}
    # Columns of tables a later migration creates are absent while migrated back.
    return {rows[key] for key in checks.database.KEY_COLUMNS if key in rows}


@pytest.mark.django_db(transaction=True)
def test_the_key_migration_reverses_and_applies_again():
    # On MariaDB/MySQL it moves the key columns between utf8mb4_bin and NO PAD; elsewhere
    # both directions do nothing.
    mysql = connection.vendor == "mysql"
    no_pad = (
        set() if not mysql else {"utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"}
    )
    assert _key_collations() == no_pad
    try:
        call_command("migrate", "jobguard", "0021", verbosity=0)
        assert _key_collations() == ({"utf8mb4_bin"} if mysql else set())
    finally:
        call_command("migrate", "jobguard", verbosity=0)
    assert _key_collations() == no_pad
