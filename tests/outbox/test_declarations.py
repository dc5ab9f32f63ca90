"""publishes(): a model's saves and deletes publish their events in the write's own transaction."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.db import connection, models, transaction
from django.test import override_settings

from django_jobguard.checks.outbox import check_declared_events
from django_jobguard.exceptions import InvalidPublishError
from django_jobguard.models import OutboxMessage
from django_jobguard.outbox import publishes
from django_jobguard.outbox.declarations import EventDeclaration, declarations
from django_jobguard.outbox.publisher import outbox_alias
from django_jobguard.outbox.relay import Relay
from tests.conftest import wait_for
from tests.outbox.destinations import read
from tests.testapp.models import Account, Execution, Tag

pytestmark = pytest.mark.django_db(transaction=True)

FIELDS = ["id", "owner", "balance"]


class Named(models.Model):
    """An abstract model: its subclasses' saves send their own signals, never its own."""

    name = models.CharField(max_length=20)

    class Meta:
        abstract = True
        app_label = "testapp"


@pytest.fixture
def declared(outbox: Path) -> Iterator[Callable[..., EventDeclaration]]:
    made: list[EventDeclaration] = []

    def declare(*args: Any, **kwargs: Any) -> EventDeclaration:
        made.append(publishes(*args, **kwargs))
        return made[-1]

    yield declare
    for declaration in made:
        declaration.disconnect()


def messages(**filters: Any) -> list[OutboxMessage]:
    return list(OutboxMessage.objects.filter(**filters).order_by("id"))


def test_a_save_publishes_one_message_in_its_transaction(declared) -> None:
    declared(Account, "events", payload=FIELDS)
    with transaction.atomic():
        account = Account.objects.create(owner="ann", balance=5)
        # Written by the save itself, before the commit, on the same connection.
        (message,) = messages()
        assert not connection.get_autocommit()
    assert message.destination == "events"
    assert message.key == f"testapp.account:{account.pk}"
    assert message.seq == 1
    assert message.payload == {"id": account.pk, "owner": "ann", "balance": 5}
    assert message.headers == {"jobguard-event": "created", "jobguard-model": "testapp.account"}
    assert message.state == "pending"


def test_a_rolled_back_save_or_delete_publishes_nothing(declared) -> None:
    declared(Account, "events", payload=FIELDS)
    with pytest.raises(RuntimeError), transaction.atomic():
        Account.objects.create(owner="bo")
        raise RuntimeError("roll back")
    assert not Account.objects.exists()
    assert messages() == []

    account = Account.objects.create(owner="cy")
    with pytest.raises(RuntimeError), transaction.atomic():
        account.balance = 1
        account.save()
        account.delete()
        raise RuntimeError("roll back")
    assert [m.headers["jobguard-event"] for m in messages()] == ["created"]


def test_a_save_outside_any_transaction_still_shares_one_with_its_event(declared) -> None:
    """Autocommit: the save is wrapped in a transaction, so an event that fails undoes the row."""
    calls: list[str] = []

    def payload(account: Account) -> Any:
        calls.append(account.owner)
        return {"bad": object()} if account.owner == "refused" else {"owner": account.owner}

    declared(Account, "events", payload=payload)
    assert connection.get_autocommit()
    Account.objects.create(owner="ok")
    with pytest.raises(InvalidPublishError, match="payload"):
        Account.objects.create(owner="refused")
    assert calls == ["ok", "refused"]
    # The refused event took its row with it: the INSERT ran in the same transaction.
    assert list(Account.objects.values_list("owner", flat=True)) == ["ok"]
    assert [m.payload for m in messages()] == [{"owner": "ok"}]


def test_a_row_s_events_are_numbered_in_the_order_of_its_saves(declared) -> None:
    declared(Account, "events", payload=["balance"])
    account = Account.objects.create(owner="dee")
    key = f"testapp.account:{account.pk}"
    for balance in (10, 20, 30):
        account.balance = balance
        account.save()
    other = Account.objects.create(owner="eve", balance=99)
    account.delete()

    ours = messages(key=key)
    assert [(m.seq, m.headers["jobguard-event"], m.payload) for m in ours] == [
        (1, "created", {"balance": 0}),
        (2, "updated", {"balance": 10}),
        (3, "updated", {"balance": 20}),
        (4, "updated", {"balance": 30}),
        (5, "deleted", {"balance": 30}),
    ]
    assert [m.seq for m in messages(key=f"testapp.account:{other.pk}")] == [1]


def test_deletes_publish_one_event_per_row_queryset_deletes_included(declared) -> None:
    declared(Account, "events", payload=["id", "owner"], on=["deleted"])
    first, second, third = (Account.objects.create(owner=name) for name in ("a", "b", "c"))
    pks = {first.pk, second.pk, third.pk}
    assert messages() == []  # on= leaves the saves out
    first.delete()
    Account.objects.filter(pk__in=[second.pk, third.pk]).delete()
    deleted = messages()
    assert sorted(m.payload["owner"] for m in deleted) == ["a", "b", "c"]
    assert {m.payload["id"] for m in deleted} == pks
    assert all(m.headers["jobguard-event"] == "deleted" for m in deleted)
    # The key was read before Django cleared the primary key.
    assert {m.key for m in deleted} == {f"testapp.account:{m.payload['id']}" for m in deleted}


def test_bulk_writes_do_not_publish_as_no_signal_fires(declared) -> None:
    declared(Account, "events", payload=FIELDS)
    accounts = Account.objects.bulk_create([Account(owner="x"), Account(owner="y")])
    Account.objects.update(balance=7)
    for account in Account.objects.all():
        account.balance = 8
    Account.objects.bulk_update(list(Account.objects.all()), ["balance"])
    assert messages() == []
    accounts[0].refresh_from_db()
    accounts[0].save()  # a plain save still publishes
    assert len(messages()) == 1


def test_key_payload_and_headers_take_templates_methods_and_callables(declared) -> None:
    declared(
        Account,
        ["events", "feed"],
        key="owner:{owner}",
        payload=lambda account: {"summary": str(account)},
        headers=lambda account: {"tenant": account.owner},
    )
    declared(Account, "events", key=None, payload="__str__", headers={"kind": "string"}, on="created")
    account = Account.objects.create(owner="fay", balance=3)

    by_destination = {(m.destination, m.key): m for m in messages() if m.key.startswith("owner:")}
    assert set(by_destination) == {("events", "owner:fay"), ("feed", "owner:fay")}
    assert by_destination["feed", "owner:fay"].payload == {"summary": str(account)}
    assert by_destination["feed", "owner:fay"].headers["tenant"] == "fay"
    (keyless,) = [m for m in messages() if not m.key.startswith("owner:")]
    assert keyless.key == str(keyless.message_id)  # key=None: a key of its own
    assert keyless.payload == str(account)
    assert keyless.headers == {
        "kind": "string",
        "jobguard-event": "created",
        "jobguard-model": "testapp.account",
    }


def test_fixtures_loaded_with_raw_saves_publish_nothing(declared) -> None:
    declared(Account, "events", payload=FIELDS)
    Account(owner="fixture").save_base(raw=True)
    assert Account.objects.filter(owner="fixture").exists()
    assert messages() == []


def test_a_write_on_another_database_than_the_outbox_s_is_refused_before_it_is_written(
    declared, settings: Any
) -> None:
    declared(Account, "events", payload=FIELDS)
    account = Account.objects.create(owner="gus")
    with override_settings(JOBGUARD={**settings.JOBGUARD, "DATABASE_ALIAS": "elsewhere"}):
        with pytest.raises(
            InvalidPublishError, match="runs on database 'default', the outbox on 'elsewhere'"
        ):
            Account.objects.create(owner="hal")
        with pytest.raises(InvalidPublishError, match="runs on database 'default'"):
            account.delete()
    assert sorted(Account.objects.values_list("owner", flat=True)) == ["gus"]
    assert len(messages()) == 1


def test_disconnect_stops_publishing_and_restores_the_model_s_save(declared) -> None:
    original = Account.save_base
    first = declared(Account, "events", payload=FIELDS)
    second = declared(Account, "feed", payload=FIELDS)
    assert Account.save_base is not original
    first.disconnect()
    assert Account.save_base is not original  # the second declaration still needs it
    Account.objects.create(owner="ida")
    assert [m.destination for m in messages()] == ["feed"]
    second.disconnect()
    assert Account.save_base is original
    assert "save_base" not in Account.__dict__
    Account.objects.create(owner="jo")
    assert len(messages()) == 1
    assert first not in declarations()


def test_publishes_refuses_what_it_cannot_use() -> None:
    with pytest.raises(TypeError, match="takes a model class"):
        publishes("testapp.Account", "events", payload=FIELDS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="destination name or a list"):
        publishes(Account, [], payload=FIELDS)
    with pytest.raises(ValueError, match="payload is a list of field names"):
        publishes(Account, "events", payload={"owner": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on takes some of created, updated, deleted"):
        publishes(Account, "events", payload=FIELDS, on=["saved"])
    with pytest.raises(ValueError, match="key is a template string"):
        publishes(Account, "events", payload=FIELDS, key=3)  # type: ignore[arg-type]
    assert declarations() == []


def test_the_system_check_names_the_model_and_the_bad_part(declared, settings: Any) -> None:
    declared(Account, "nowhere", payload=FIELDS)
    declared(Account, "events", key="account:{acount_id}", payload=["owner", "ballance", "tags"])
    declared(Account, "events", payload="as_event", headers={"bad name": "v"})
    declared(Tag, "events", payload=["name"])  # a good one: no error
    declared(Named, "events", payload=["name"])

    errors = check_declared_events()
    assert all(isinstance(e, checks.Error) and e.id == "jobguard.E061" for e in errors)
    abstract = [e for e in errors if e.obj is Named]
    assert [e.msg for e in abstract] == [
        "publishes(testapp.Named): Named is abstract: declare the events on each model that is saved."
    ]
    errors = [e for e in errors if e.obj is not Named]
    assert all(e.obj is Account for e in errors)
    found = sorted(e.msg for e in errors)
    assert found == sorted(
        [
            "publishes(testapp.Account): destination 'nowhere' is not declared in "
            "JOBGUARD['OUTBOX']['DESTINATIONS'] (declared: events, feed).",
            "publishes(testapp.Account): key template 'account:{acount_id}' names 'acount_id', "
            "which Account lacks.",
            "publishes(testapp.Account): payload names the field 'ballance', which Account lacks.",
            "publishes(testapp.Account): payload field 'tags' is not a column of Account (a relation).",
            "publishes(testapp.Account): payload names the method 'as_event', which Account lacks.",
            "publishes(testapp.Account): header name 'bad name' is not an HTTP token of 1 to 128 "
            "characters (letters, digits and !#$%&'*+-.^_`|~).",
        ]
    )

    with override_settings(JOBGUARD={**settings.JOBGUARD, "DATABASE_ALIAS": "elsewhere"}):
        tag_errors = [e.msg for e in check_declared_events() if "testapp.Tag" in e.msg]
    assert tag_errors == [
        "publishes(testapp.Tag): Tag is written on database 'default', the outbox on 'elsewhere' "
        "(JOBGUARD['DATABASE_ALIAS']): its events could not share the write's transaction."
    ]


# -- commit order across connections --------------------------------------------------------


def _backend_waiting_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        return bool(cursor.fetchone()[0])


@pytest.mark.postgres
def test_concurrent_saves_of_a_row_publish_in_commit_order(declared) -> None:
    declared(Account, "events", payload=["owner"])
    account = Account.objects.create(owner="start")
    a_saved = threading.Event()
    a_may_commit = threading.Event()
    committed: list[str] = []

    def save(owner: str, hold: bool) -> None:
        try:
            with transaction.atomic():
                row = Account.objects.get(pk=account.pk)
                row.owner = owner
                row.save()
                if hold:
                    a_saved.set()
                    assert a_may_commit.wait(60)
            committed.append(owner)
        finally:
            connection.close()

    a = threading.Thread(target=save, args=("a", True))
    a.start()
    assert a_saved.wait(60)
    b = threading.Thread(target=save, args=("b", False))
    b.start()
    wait_for(_backend_waiting_for_a_lock, 60, message="B's save to wait on A's transaction")
    a_may_commit.set()
    a.join(60)
    b.join(60)
    assert committed == ["a", "b"]
    assert [(m.seq, m.payload["owner"]) for m in messages(key=f"testapp.account:{account.pk}")] == [
        (1, "start"),
        (2, "a"),
        (3, "b"),
    ]


def test_declared_events_reach_the_destination_in_the_order_of_the_saves(declared, outbox: Path) -> None:
    declared(Account, "events", payload=["balance"])
    account = Account.objects.create(owner="kim")
    for balance in (1, 2, 3):
        with transaction.atomic():
            account.balance = balance
            account.save()
    account.delete()
    assert Relay(outbox_alias(), "test-relay").drain() == 5

    lines = read(outbox / "events.jsonl")
    assert [(line["seq"], line["headers"]["jobguard-event"], line["payload"]) for line in lines] == [
        (1, "created", {"balance": 0}),
        (2, "updated", {"balance": 1}),
        (3, "updated", {"balance": 2}),
        (4, "updated", {"balance": 3}),
        (5, "deleted", {"balance": 3}),
    ]
    assert {line["headers"]["jobguard-model"] for line in lines} == {"testapp.account"}


def test_field_values_are_published_as_json_times_in_iso_8601(declared) -> None:
    declared(Execution, "events", payload=["pk", "marker", "created_at"], key="marker:{marker}")
    execution = Execution.objects.create(marker="m-1")
    (message,) = messages()
    assert message.key == "marker:m-1"
    assert message.payload == {
        "pk": execution.pk,
        "marker": "m-1",
        "created_at": execution.created_at.isoformat(),  # with its microseconds
    }
