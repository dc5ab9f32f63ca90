"""The system checks of a MariaDB/MySQL job store: each refusal names its fix.

The OPTIONS checks read settings only and run everywhere; the server checks inspect the
MariaDB server of the run (``JOBGUARD_TEST_DATABASE_URL=mysql://...``), changing one session
or table at a time and putting it back.
"""

import pytest
from django.core.management import call_command
from django.db import connection

from django_jobguard import checks

GOOD = {"charset": "utf8mb4", "isolation_level": "read committed", "init_command": "SET time_zone = '+00:00'"}


def ids(messages):
    return sorted(message.id for message in messages)


def test_good_options_pass_and_each_missing_one_names_the_fix():
    assert checks.database._mysql_options("default", GOOD) == []
    (charset,) = checks.database._mysql_options("default", {**GOOD, "charset": "utf8"})
    assert charset.id == "jobguard.E050"
    assert "in utf8:" in charset.msg and "'charset': 'utf8mb4'" in charset.hint
    # Django's own default charset (utf8, which is utf8mb3) is refused too.
    assert ids(checks.database._mysql_options("default", {"isolation_level": "read committed"})) == [
        "jobguard.E050"
    ]
    (isolation,) = checks.database._mysql_options("default", {**GOOD, "isolation_level": "repeatable read"})
    assert isolation.id == "jobguard.E051"
    assert "REPEATABLE READ" in isolation.msg and "'isolation_level': 'read committed'" in isolation.hint


mysql_only = pytest.mark.mysql


def server_ids():
    return ids(checks.database._mysql_server("default"))


@mysql_only
@pytest.mark.django_db
def test_the_test_server_passes_every_server_check():
    assert checks.database.check_mysql_server(databases=["default"]) == []


@mysql_only
@pytest.mark.django_db
def test_a_session_at_repeatable_read_is_refused():
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    try:
        (error,) = checks.database._mysql_server("default")
        assert error.id == "jobguard.E057"
        assert "REPEATABLE-READ" in error.msg and "read committed" in error.hint
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")


@mysql_only
@pytest.mark.django_db
def test_a_session_off_utc_is_refused():
    with connection.cursor() as cursor:
        cursor.execute("SET time_zone = '+02:00'")
    try:
        (error,) = checks.database._mysql_server("default")
        assert error.id == "jobguard.E056"
        assert "7200 seconds away from UTC" in error.msg and "SET time_zone = '+00:00'" in error.hint
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET time_zone = '+00:00'")


@mysql_only
@pytest.mark.django_db(transaction=True)
def test_a_myisam_table_and_a_non_utf8mb4_table_are_refused_by_name():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE jobguard_maria_probe (id int PRIMARY KEY) ENGINE=MyISAM CHARSET latin1")
    try:
        messages = {message.id: message for message in checks.database._mysql_server("default")}
        assert sorted(messages) == ["jobguard.E054", "jobguard.E055"]
        assert "jobguard_maria_probe" in messages["jobguard.E054"].msg
        assert "ENGINE=InnoDB" in messages["jobguard.E054"].hint
        assert "jobguard_maria_probe" in messages["jobguard.E055"].msg
        assert "CONVERT TO CHARACTER SET utf8mb4" in messages["jobguard.E055"].hint
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE jobguard_maria_probe")


@mysql_only
@pytest.mark.django_db
def test_a_server_without_skip_locked_is_refused(monkeypatch):
    # The server of this run is 10.11; an older one is what Django's version reads as.
    monkeypatch.setattr(connection, "mysql_version", (10, 5, 9))
    monkeypatch.setattr(connection.features, "has_select_for_update_skip_locked", False)
    assert "jobguard.E052" in server_ids()
    (error,) = [m for m in checks.database._mysql_server("default") if m.id == "jobguard.E052"]
    assert "MariaDB 10.5.9" in error.msg and "MariaDB 10.6 or later" in error.hint


@mysql_only
@pytest.mark.django_db
def test_a_duplicate_key_on_mariadb_is_told_from_other_integrity_errors():
    from django.db import IntegrityError, transaction

    from django_jobguard import store
    from django_jobguard.models import QueueState

    QueueState.objects.create(queue_name="maria-dup")
    with pytest.raises(IntegrityError) as duplicate, transaction.atomic():
        QueueState.objects.create(queue_name="maria-dup")
    assert store.is_unique_violation(duplicate.value)
    with pytest.raises(IntegrityError) as null, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("INSERT INTO jobguard_queuestate (queue_name) VALUES (NULL)")
    assert not store.is_unique_violation(null.value)


@mysql_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "collation", ["utf8mb4_bin", "utf8mb4_general_ci"], ids=["pad-space", "ignores-case"]
)
def test_a_key_column_altered_by_hand_to_compare_loosely_is_refused_by_name(collation):
    # 0022 gave it a NO PAD binary collation; an ALTER TABLE by hand (or a later AlterField)
    # can take it away, and 'a' and 'a ' (or 'A' and 'a') are then one key again.
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE jobguard_lock MODIFY `key` varchar(255) CHARACTER SET utf8mb4 "
            f"COLLATE {collation} NOT NULL"
        )
    try:
        (error,) = checks.database._mysql_server("default")
        assert error.id == "jobguard.E058"
        assert f"jobguard_lock.key ({collation})" in error.msg and "jobguard_job" not in error.msg
        assert "sqlmigrate jobguard 0022" in error.hint and "utf8mb4_nopad_bin" in error.hint
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "ALTER TABLE jobguard_lock MODIFY `key` varchar(255) CHARACTER SET utf8mb4 "
                "COLLATE utf8mb4_nopad_bin NOT NULL"
            )
    assert server_ids() == []


@mysql_only
@pytest.mark.django_db(transaction=True)
def test_key_columns_are_not_refused_before_the_migration_that_changes_them():
    # migrate runs this check first: it must not refuse what the pending migration will fix.
    call_command("migrate", "jobguard", "0021", verbosity=0)
    try:
        assert server_ids() == []
    finally:
        call_command("migrate", "jobguard", verbosity=0)
    assert server_ids() == []
