"""Which database module serves an alias, and what it says of itself (not part of the store contract:
the in-memory store is substituted, never chosen by vendor)."""

import pytest
from django.db import connection

from django_jobguard import store
from django_jobguard.store import mysql, postgres, sqlite

pytestmark = pytest.mark.django_db


def test_each_alias_is_served_by_its_databases_module():
    expected = {"postgresql": postgres, "mysql": mysql, "sqlite": sqlite}[connection.vendor]
    assert store.dialect_of("default") is expected
    assert store.writes_while_busy("default") is (connection.vendor != "sqlite")
