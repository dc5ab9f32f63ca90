"""What holds PostgreSQL's vacuum horizon is named: the worker's warning, the gauges,
``jobguard_status``, the queues page, the timeouts check and the long atomic tasks' check.

Real sessions hold it: a second connection left idle in transaction, in the jobs' database and
in another database of the cluster. The cluster is shared with other test runs, so each test
looks for its own holder by pid, never for "the only one".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from django_jobguard import checks
from django_jobguard.maintenance import HorizonWatcher
from django_jobguard.monitoring import health, metrics
from django_jobguard.store.horizon import holders

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

#: A threshold every holder of these tests is past by the time it is read.
SOON = {"HORIZON": {"WARN_AFTER": 0.001}}
APPLICATION = "jg-horizon-test"
OTHER_DATABASE_SUFFIX = "_horizon_other"


def _conninfo(dbname: str) -> dict[str, Any]:
    settings = connection.settings_dict
    return {
        "host": settings["HOST"] or None,
        "port": settings["PORT"] or None,
        "user": settings["USER"] or None,
        "password": settings["PASSWORD"] or None,
        "dbname": dbname,
    }


def _connect(dbname: str, **options: Any) -> Any:
    import psycopg

    return psycopg.connect(**_conninfo(dbname), application_name=APPLICATION, **options)


@pytest.fixture
def idle_holder() -> Iterator[Callable[..., Any]]:
    """Open a connection to a database and leave it idle in a transaction; all closed afterwards."""
    opened: list[Any] = []

    def open_holder(dbname: str | None = None, statement: str = "SELECT txid_current()") -> Any:
        conn = _connect(dbname or str(connection.settings_dict["NAME"]))
        opened.append(conn)
        if statement.startswith("BEGIN"):
            conn.autocommit = True
            conn.execute(statement)
        else:
            conn.execute(statement)  # psycopg opens the transaction; it stays open, idle
        return conn

    yield open_holder
    for conn in opened:
        conn.close()


@pytest.fixture(scope="module")
def other_database(django_db_blocker: Any) -> Iterator[str]:
    """Another database of the same cluster (created for these tests, dropped after)."""
    import psycopg

    name = str(connection.settings_dict["NAME"]) + OTHER_DATABASE_SUFFIX
    with django_db_blocker.unblock():
        admin = psycopg.connect(**_conninfo("postgres"), autocommit=True)
        try:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
            admin.execute(f'CREATE DATABASE "{name}"')
            yield name
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.close()


def _warnings_for(caplog: pytest.LogCaptureFixture, pid: int) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING
        and record.getMessage().startswith("vacuum_horizon_held")
        and f" pid={pid} " in record.getMessage()
    ]


@override_settings(JOBGUARD=SOON)
def test_a_session_idle_in_transaction_is_named_with_its_details_then_released(
    idle_holder, caplog, admin_client
):
    holder = idle_holder()
    pid = holder.info.backend_pid
    database = str(connection.settings_dict["NAME"])
    watcher = HorizonWatcher("default", "w-test")

    with caplog.at_level(logging.INFO, logger="django_jobguard.worker"):
        result = watcher.run_once()
    [message] = _warnings_for(caplog, pid)
    assert "kind=session" in message
    assert f"database={database!r}" in message
    assert f"user={connection.settings_dict['USER']!r}" in message
    assert f"application={APPLICATION!r}" in message
    assert "state='idle in transaction'" in message
    assert "query='SELECT txid_current()'" in message
    assert "docs/runbooks/vacuum-horizon-held.md" in message
    ours = next(h for h in result.held if h.pid == pid)
    assert ours.age_seconds is not None and ours.age_seconds > 0
    assert f"age={ours.age_seconds:.0f}s xid_age={ours.xid_age} " in message
    # The gauge: the oldest holder's age, ours or older.
    assert result.age_seconds >= ours.age_seconds
    if metrics.ENABLED:
        from prometheus_client import REGISTRY

        assert REGISTRY.get_sample_value("jobguard_vacuum_horizon_age_seconds") == result.age_seconds
        assert REGISTRY.get_sample_value("jobguard_vacuum_horizon_xid_age") >= ours.xid_age

    # jobguard_status names it above the table, and in its JSON.
    out = StringIO()
    call_command("jobguard_status", stdout=out)
    line = next(line for line in out.getvalue().splitlines() if f"session pid {pid} " in line)
    assert line.startswith("vacuum horizon held by session pid")
    assert f"database {database}" in line and f"application {APPLICATION}" in line
    assert "idle in transaction" in line and "docs/runbooks/vacuum-horizon-held.md" in line
    out = StringIO()
    call_command("jobguard_status", "--json", stdout=out)
    [entry] = [e for e in json.loads(out.getvalue())["vacuum_horizon"] if e["pid"] == pid]
    assert entry["kind"] == "session" and entry["application"] == APPLICATION and "query" not in entry

    # The queues page shows it above the queues, without the query's text.
    html = admin_client.get("/admin/jobguard/queuestate/").content.decode()
    assert f'data-pid="{pid}"' in html
    assert f"vacuum horizon held by session pid {pid} (database {database}" in html
    assert "runbook: vacuum-horizon-held" in html
    assert "txid_current" not in html

    # It ends: the next pass says so, and nothing names it any more.
    holder.commit()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="django_jobguard.worker"):
        after = watcher.run_once()
    assert all(h.pid != pid for h in after.holders)
    released = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("vacuum_horizon_released")
    ]
    assert any(f"session pid {pid} " in message for message in released), released
    assert not _warnings_for(caplog, pid)
    out = StringIO()
    call_command("jobguard_status", stdout=out)
    assert f"session pid {pid} " not in out.getvalue()
    assert f'data-pid="{pid}"' not in admin_client.get("/admin/jobguard/queuestate/").content.decode()


@override_settings(JOBGUARD={"HORIZON": {"WARN_AFTER": 3600.0}})
def test_a_young_holder_sets_the_gauge_but_is_not_named(idle_holder, caplog):
    holder = idle_holder()
    pid = holder.info.backend_pid
    with caplog.at_level(logging.INFO, logger="django_jobguard.worker"):
        result = HorizonWatcher("default").run_once()
    assert any(h.pid == pid for h in result.holders)
    assert all(h.pid != pid for h in result.held)
    assert not _warnings_for(caplog, pid)
    assert result.age_seconds > 0
    assert all(hold.holder.pid != pid for hold in health.horizon_holds("default"))


@override_settings(JOBGUARD=SOON)
def test_a_transaction_in_another_database_of_the_cluster_is_named(idle_holder, other_database, caplog):
    holder = idle_holder(other_database)
    pid = holder.info.backend_pid
    with caplog.at_level(logging.INFO, logger="django_jobguard.worker"):
        HorizonWatcher("default").run_once()
    [message] = _warnings_for(caplog, pid)
    assert f"database={other_database!r}" in message
    assert f"application={APPLICATION!r}" in message and "state='idle in transaction'" in message


@override_settings(JOBGUARD=SOON)
def test_a_snapshot_alone_in_another_database_does_not_hold_this_ones_horizon(idle_holder, other_database):
    # PostgreSQL 14 and later: a read-only snapshot elsewhere does not hold this database's
    # horizon (a transaction id does: every snapshot taken here then includes it).
    if connection.pg_version < 140000:
        pytest.skip("before PostgreSQL 14 a snapshot in any database holds every database's horizon")
    reader = idle_holder(other_database, "BEGIN ISOLATION LEVEL REPEATABLE READ")
    reader.execute("SELECT count(*) FROM pg_class")
    assert all(h.pid != reader.info.backend_pid for h in holders("default"))
    # The same snapshot in the jobs' database holds it.
    here = idle_holder(None, "BEGIN ISOLATION LEVEL REPEATABLE READ")
    here.execute("SELECT 1")
    [found] = [h for h in holders("default") if h.pid == here.info.backend_pid]
    assert found.state == "idle in transaction" and found.kind == "session"


def test_a_logical_slot_holds_only_the_catalogs_and_is_not_named():
    with connection.cursor() as cursor:
        cursor.execute("SHOW wal_level")
        (level,) = cursor.fetchone()
    if level != "logical":
        pytest.skip(f"a logical slot needs wal_level=logical; this server runs wal_level={level}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_create_logical_replication_slot('jg_test_slot', 'test_decoding')")
        try:
            assert all(h.name != "jg_test_slot" for h in holders("default"))
        finally:
            cursor.execute("SELECT pg_drop_replication_slot('jg_test_slot')")


def test_a_physical_slot_without_a_standby_has_no_xmin_and_is_not_named():
    # A physical slot gets an xmin only from a standby with hot_standby_feedback, which this
    # suite does not run: it reserves WAL, and holds no horizon.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_create_physical_replication_slot('jg_test_physical', true)")
        try:
            cursor.execute(
                "SELECT xmin IS NULL FROM pg_replication_slots WHERE slot_name = 'jg_test_physical'"
            )
            assert cursor.fetchone() == (True,)
            assert all(h.name != "jg_test_physical" for h in holders("default"))
        finally:
            cursor.execute("SELECT pg_drop_replication_slot('jg_test_physical')")


@override_settings(JOBGUARD=SOON)
def test_the_watcher_measures_a_holder_without_a_clock_from_when_it_first_saw_it(idle_holder):
    # A hidden session (no pg_read_all_stats), a slot or a standby: the server gives no start.
    from django_jobguard.maintenance.horizon import held_for
    from django_jobguard.store.horizon import Holder

    slot = Holder("replication slot", None, "abandoned", "", "", "", "", "", None, 5000, "731")
    first_seen = {("replication slot", None, "abandoned", "731"): 100.0}
    assert held_for(slot, first_seen, 400.0) == 300.0
    assert held_for(slot, {}, 400.0) == 0.0
    assert "replication slot abandoned (database -, inactive)" == slot.describe()


# -- the checks ---------------------------------------------------------------------------


def _timeout_warnings() -> list[Any]:
    return [
        m
        for m in checks.database.check_transaction_timeouts(databases=["default"])
        if m.id == "jobguard.W063"
    ]


def test_the_timeouts_check_warns_while_idle_in_transaction_session_timeout_is_off():
    with connection.cursor() as cursor:
        cursor.execute("SET idle_in_transaction_session_timeout = 0")
        if connection.pg_version >= 170000:
            cursor.execute("SET transaction_timeout = 0")
    try:
        [warning] = _timeout_warnings()
        assert "idle_in_transaction_session_timeout" in warning.msg
        assert ("transaction_timeout" in warning.msg.replace("idle_in_transaction_session_timeout", "")) == (
            connection.pg_version >= 170000
        )
        assert "-c idle_in_transaction_session_timeout=60s" in warning.hint
        with connection.cursor() as cursor:
            cursor.execute("SET idle_in_transaction_session_timeout = '60s'")
            if connection.pg_version >= 170000:
                cursor.execute("SET transaction_timeout = '10min'")
        assert _timeout_warnings() == []
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET idle_in_transaction_session_timeout")
            if connection.pg_version >= 170000:
                cursor.execute("RESET transaction_timeout")


def test_the_timeouts_check_runs_only_when_asked_for_the_jobs_database():
    assert checks.database.check_transaction_timeouts(databases=None) == []
    assert checks.database.check_transaction_timeouts(databases=["other"]) == []
