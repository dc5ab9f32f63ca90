"""Telling a missing table or column apart from other database errors, on each database."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction

from django_jobguard.models import QueueState
from django_jobguard.store import schema

pytestmark = pytest.mark.django_db


def error_of(sql: str) -> DatabaseError:
    with pytest.raises(DatabaseError) as caught, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql)
    return caught.value


def test_a_missing_table_and_a_missing_column_are_missing_relations() -> None:
    assert schema.is_missing_relation(error_of("SELECT 1 FROM jobguard_no_such_table"))
    assert schema.is_missing_relation(error_of("SELECT no_such_column FROM jobguard_job"))


def test_other_errors_are_not_missing_relations() -> None:
    assert not schema.is_missing_relation(error_of("SELEC 1"))  # a syntax error
    QueueState.objects.create(queue_name="twice")
    with pytest.raises(IntegrityError) as caught, transaction.atomic():
        QueueState.objects.create(queue_name="twice")
    assert not schema.is_missing_relation(caught.value)


def test_the_migrated_test_database_lacks_nothing() -> None:
    assert schema.missing_tables("default") == []
    assert schema.unapplied_migrations("default") == []
