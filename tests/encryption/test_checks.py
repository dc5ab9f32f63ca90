"""The encryption checks: a task that encrypts has a key (E080), stored values have theirs
(E081, for check --database and migrate), and values under a retired key are announced (W080)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobguard import task
from django_jobguard.checks.encryption import check_encryption_keys, check_stored_keys
from django_jobguard.encryption.fields import ENCRYPTED_FIELDS
from django_jobguard.encryption.rotation import SURVEY_ROWS, survey
from django_jobguard.models import Job
from django_jobguard.registry import registry
from tests.support.rotation import K1, K2, K3, keys_restored, set_keys


@pytest.fixture(autouse=True)
def _keys() -> Iterator[None]:
    with keys_restored():
        set_keys(K1)
        yield


@pytest.fixture
def define() -> Iterator[Callable[..., Any]]:
    names: list[str] = []

    def make(name: str, **options: Any) -> Any:
        def handler(card: str) -> None: ...

        created = task(name=f"tests.encryption.{name}", **options)(handler)
        names.append(created.name)
        return created

    yield make
    for name in names:
        registry.unregister(name)


def _seal_job(args: list[Any]) -> Job:
    args_field = next(f for f in ENCRYPTED_FIELDS if f.model_name == "Job" and f.field == "args")
    return Job.objects.create(task_name="tests.charge", args=args_field.encrypt(args))


def test_a_task_that_encrypts_needs_a_key(define):
    sealed = define("sealed", encrypt=True)
    plain = define("plain")
    assert check_encryption_keys() == []

    set_keys()
    messages = check_encryption_keys()

    mine = [m for m in messages if m.obj in (sealed, plain)]
    assert [(m.id, m.obj) for m in mine] == [("jobguard.E080", sealed)]
    assert all(m.id == "jobguard.E080" and m.obj.encrypt for m in messages)  # the test app's too
    assert "jobguard_encryption_key" in (mine[0].hint or "")


def test_all_tasks_needs_a_key(settings):
    set_keys()
    settings.JOBGUARD = {**settings.JOBGUARD, "ENCRYPTION": {"ALL_TASKS": True}}
    messages = check_encryption_keys()
    assert [m.id for m in messages] == ["jobguard.E082"]
    assert "ALL_TASKS" in messages[0].msg


@pytest.mark.django_db
def test_values_under_a_key_no_longer_configured_are_an_error_naming_it():
    job = _seal_job(["card"])
    set_keys(K2)  # k1 removed before its values were re-encrypted

    messages = check_stored_keys(databases=["default"])

    assert [m.id for m in messages] == ["jobguard.E081"]
    assert "'k1'" in messages[0].msg and f"jobguard_job pk={job.pk} args" in messages[0].msg
    with pytest.raises(SystemCheckError, match=r"jobguard\.E081"):
        call_command("check", "--database", "default", stdout=StringIO(), stderr=StringIO())
    set_keys(K2, K1)
    assert [m.id for m in check_stored_keys(databases=["default"])] == ["jobguard.W080"]


@pytest.mark.django_db
def test_values_under_a_retired_key_warn_with_their_count_and_the_command():
    for n in range(3):
        _seal_job([f"card-{n}"])
    set_keys(K2, K1)
    _seal_job(["new"])

    messages = check_stored_keys(databases=["default"])

    assert [m.id for m in messages] == ["jobguard.W080"]
    assert "'k1'" in messages[0].msg and "jobguard_job.args 3" in messages[0].msg
    assert "jobguard_reencrypt" in (messages[0].hint or "")
    call_command("jobguard_reencrypt", stdout=StringIO())
    assert check_stored_keys(databases=["default"]) == []


@pytest.mark.django_db
def test_clear_rows_and_a_database_not_asked_for_say_nothing():
    Job.objects.create(task_name="tests.plain", args=["jg1:k9:looks like a token, inside a list"])
    assert check_stored_keys(databases=["default"]) == []
    set_keys(K2)
    _seal_job(["x"])
    set_keys(K3)
    assert check_stored_keys(databases=None) == []  # plain `check`: the database is not read


@pytest.mark.django_db
def test_the_survey_reads_a_bounded_window_of_a_big_table():
    # Rows in the middle of a table bigger than two windows are not read; the oldest and
    # the newest are, whatever the size, with a fixed number of queries.
    plain = [Job(task_name="tests.plain", args=[n]) for n in range(2 * 3 + 5)]
    Job.objects.bulk_create(plain[:3])
    old = _seal_job(["old"])
    Job.objects.bulk_create(plain[3:8])
    middle = _seal_job(["middle"])
    Job.objects.bulk_create(plain[8:])
    new = _seal_job(["new"])
    set_keys(K2, K1)

    with CaptureQueriesContext(connection) as queries:
        found = survey("default", rows=4)

    assert found.retired == {("jobguard_job.args", "k1"): 2}  # old and new, not middle
    assert middle.pk not in (old.pk, new.pk)
    models = {field.model_name for field in ENCRYPTED_FIELDS}
    assert len(queries) <= 4 * len(models)
    assert SURVEY_ROWS >= 100


@pytest.mark.django_db(transaction=True)
def test_migrate_stops_a_deploy_that_lost_a_key_still_in_use():
    # Where a deploy meets it first: migrate runs the database checks before anything else.
    _seal_job(["card"])
    set_keys(K2)
    with pytest.raises(SystemCheckError, match=r"jobguard\.E081"):
        call_command("migrate", verbosity=0, skip_checks=False, stdout=StringIO(), stderr=StringIO())
    set_keys(K2, K1)
    call_command("migrate", verbosity=0, skip_checks=False, stdout=StringIO(), stderr=StringIO())  # W080 only
