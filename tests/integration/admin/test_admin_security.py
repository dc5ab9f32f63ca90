"""Every model admin, as a user without ``jobguard.view_payload``: no payload readable through the
query string or the search, refused lookups are a 400 (never a 500); and what a superuser may
delete: never a dead letter or a replay event, a job or a key only where no invariant breaks."""

import datetime

import pytest
from django.contrib import admin
from django.db import connection
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from django_jobguard.locks import lock
from django_jobguard.maintenance.retention import JOB_DELETION_RULE, KEY_DELETION_RULE
from django_jobguard.models import DeadLetter, IdempotencyKey, Job, Lock, ReplayEvent
from django_jobguard.monitoring.audit import audit
from tests.support.dlq import dead_charge
from tests.support.factories import make_job, make_superuser, make_user
from tests.testapp import tasks_dlq

pytestmark = pytest.mark.django_db(transaction=True)

VIEW_ALL = ("view_job", "view_deadletter", "view_idempotencykey", "view_lock")
SECRET_ORDER = 4242


@pytest.fixture
def rows():
    """A dead charge of order 4242 (job, dead letter, failed key), a succeeded key, a held lock."""
    letter = dead_charge(order_id=SECRET_ORDER, amount=0, key="charge:secret")
    IdempotencyKey.objects.create(
        key="refund:1",
        scope="tests.testapp.tasks_dlq.refund",
        fingerprint="f" * 64,
        status="succeeded",
        result={"card": "4111-secret"},
        expires_at=timezone.now() + datetime.timedelta(days=1),
    )
    held = lock("order:secret", ttl=60, backend="database")
    assert held.acquire(blocking=False)
    return letter


@pytest.fixture
def viewer():
    return make_user("vic", *VIEW_ALL)


@pytest.fixture
def reader():
    return make_user("pia", *VIEW_ALL, "view_payload")


# Each lookup answers "1 row" or "0 rows" today, so a payload, a result, a traceback or a
# lock's owner token can be read out a character at a time.
LEAKS = [
    ("job", "kwargs__order_id", str(SECRET_ORDER)),
    ("job", "kwargs__amount__lte", "0"),
    ("job", "args__contains", "[]"),
    ("job", "result__isnull", "true"),
    ("job", "checkpoints__has_key", "step"),
    ("job", "last_error__startswith", "PermanentError"),
    ("deadletter", "traceback__contains", "charge"),
    ("deadletter", "kwargs__order_id__startswith", "42"),
    ("deadletter", "replay_kwargs__isnull", "true"),
    ("deadletter", "job__kwargs__order_id", str(SECRET_ORDER)),
    ("idempotencykey", "result__card__startswith", "4"),
    ("idempotencykey", "job__kwargs__order_id", str(SECRET_ORDER)),
    ("idempotencykey", "fingerprint__startswith", "f"),
    ("lock", "token__startswith", "a"),
]


def changelist(model: str) -> str:
    return reverse(f"admin:jobguard_{model}_changelist")


@pytest.mark.parametrize(("model", "lookup", "value"), LEAKS)
def test_a_lookup_the_filters_do_not_offer_is_a_400(client, rows, viewer, model, lookup, value):
    client.force_login(viewer)
    response = client.get(changelist(model), {lookup: value})
    assert response.status_code == 400, (lookup, response.status_code)
    assert str(SECRET_ORDER) not in response.content.decode()


@pytest.mark.parametrize(("model", "lookup", "value"), LEAKS[:3])
def test_the_rule_holds_for_users_who_may_see_payloads_too(client, rows, reader, model, lookup, value):
    # The filters are the interface; a payload reader searches instead (below).
    client.force_login(reader)
    assert client.get(changelist(model), {lookup: value}).status_code == 400


@pytest.mark.parametrize("model", ["job", "deadletter"])
def test_a_json_contains_lookup_is_a_400_not_a_500(rows, viewer, model):
    """On SQLite, Django's JSON ``contains`` raises NotSupportedError inside the change list."""
    from django.test import Client

    client = Client(raise_request_exception=False)
    client.force_login(viewer)
    response = client.get(changelist(model), {"kwargs__contains": '{"order_id": 4242}'})
    assert response.status_code == 400, connection.vendor


@pytest.mark.parametrize(
    ("model", "query", "count"),
    [
        ("job", {"status__exact": "dead"}, 1),
        ("job", {"queue_name": "default", "task_name": "tests.testapp.tasks_dlq.charge"}, 1),
        ("job", {"enqueued": "24h"}, 1),
        ("job", {"lock_key": "order:secret", "status__exact": "running"}, 0),  # the lock admin's link
        ("deadletter", {"reason__exact": "permanent_error", "replay_state__exact": "none"}, 1),
        ("deadletter", {"created_at__gte": "2000-01-01 00:00Z", "created_at__lt": "2999-01-01 00:00Z"}, 1),
        ("idempotencykey", {"status__exact": "succeeded"}, 1),
        ("idempotencykey", {"scope": "tests.testapp.tasks_dlq.charge"}, 1),
        ("lock", {"held": "yes"}, 1),
    ],
)
def test_the_filters_the_pages_offer_still_work(client, rows, viewer, model, query, count):
    client.force_login(viewer)
    response = client.get(changelist(model), query)
    assert response.status_code == 200
    assert response.context["cl"].result_count == count


@pytest.mark.parametrize(
    ("model", "term"),
    # Payload values, tracebacks and error messages (which echo them) are never scanned: the
    # search compares whole values of indexed columns, for everyone.
    [
        ("job", "order_id"),
        ("job", str(SECRET_ORDER)),
        ("deadletter", "order_id"),
        ("deadletter", "Traceback"),
        ("deadletter", "positive number"),
    ],
)
def test_the_search_never_scans_payloads_or_messages(client, rows, reader, model, term):
    client.force_login(reader)
    response = client.get(changelist(model), {"q": term})
    assert response.status_code == 200 and response.context["cl"].result_count == 0


def test_the_search_matches_whole_values_of_ids_task_names_error_classes_and_lock_keys(client, rows, viewer):
    client.force_login(viewer)
    job = Job.objects.get(pk=rows.job_id)
    job.lock_key = "order:secret"
    job.save(update_fields=["lock_key"])
    assert client.get(changelist("job"), {"q": str(job.pk)}).context["cl"].result_count == 1
    assert client.get(changelist("job"), {"q": "order:secret"}).context["cl"].result_count == 1
    assert client.get(changelist("job"), {"q": "order:secre"}).context["cl"].result_count == 0
    letter = client.get(changelist("deadletter"), {"q": "tests.testapp.tasks_dlq.charge"})
    assert letter.context["cl"].result_count == 1
    assert client.get(changelist("deadletter"), {"q": "tasks_dlq.charge"}).context["cl"].result_count == 0
    by_class = client.get(changelist("deadletter"), {"q": rows.error_class})
    assert by_class.context["cl"].result_count == 1
    # Words are alternatives: pasted ids list every row they name; a word that is not an id
    # (or an id past the column's range) is no error.
    other = dead_charge(order_id=7, amount=0, key="charge:other")
    pasted = client.get(changelist("deadletter"), {"q": f"{rows.pk} {other.pk} 99999999999999999999 x"})
    assert pasted.status_code == 200 and pasted.context["cl"].result_count == 2


@pytest.mark.parametrize(("model", "term"), [("job", "charge:secret"), ("deadletter", "charge:secret")])
def test_keys_are_searched_only_for_users_who_may_see_payloads(client, rows, viewer, reader, model, term):
    # Keys are made of the arguments.
    client.force_login(viewer)
    response = client.get(changelist(model), {"q": term})
    assert response.status_code == 200 and response.context["cl"].result_count == 0
    client.force_login(reader)
    assert client.get(changelist(model), {"q": term}).context["cl"].result_count == 1


# -- what a superuser may delete ------------------------------------------------------------------


@pytest.fixture
def superuser(client):
    client.force_login(make_superuser())
    return client


def delete_url(obj) -> str:
    return reverse(f"admin:jobguard_{obj._meta.model_name}_delete", args=[obj.pk])


def change_page(client, obj) -> str:
    url = reverse(f"admin:jobguard_{obj._meta.model_name}_change", args=[obj.pk])
    return client.get(url).content.decode()


def assert_audit_clean():
    assert [(f.check, f.sample) for f in audit() if not f.ok] == []


def test_dead_letters_cannot_be_deleted_through_the_admin(superuser, rows):
    letter = rows
    dlq_events = ReplayEvent.objects.filter(dead_letter=letter).count()
    assert 'value="delete_selected"' not in superuser.get(changelist("deadletter")).content.decode()
    assert delete_url(letter) not in change_page(superuser, letter)
    assert superuser.post(delete_url(letter), {"post": "yes"}).status_code == 403
    bulk = {"action": "delete_selected", "_selected_action": [letter.pk], "post": "yes"}
    superuser.post(changelist("deadletter"), bulk)
    assert DeadLetter.objects.filter(pk=letter.pk).exists()
    assert ReplayEvent.objects.filter(dead_letter=letter).count() == dlq_events
    assert_audit_clean()


def test_replay_events_have_no_admin_pages():
    assert not admin.site.is_registered(ReplayEvent)
    with pytest.raises(NoReverseMatch):
        reverse("admin:jobguard_replayevent_changelist")


def test_a_running_job_and_a_dead_job_with_its_dead_letter_are_not_deletable(superuser, rows):
    dead = rows.job
    active = make_job("running", task=tasks_dlq.charge, kwargs={"order_id": 1, "amount": 5})
    for job in (dead, active):
        assert delete_url(job) not in change_page(superuser, job)
        response = superuser.post(delete_url(job), {"post": "yes"})
        assert response.status_code == 403
        assert JOB_DELETION_RULE in response.content.decode()
        assert "Django administration" in response.content.decode()
    assert set(Job.objects.values_list("pk", flat=True)) >= {dead.pk, active.pk}
    assert_audit_clean()


def test_a_finished_job_nothing_refers_to_can_be_deleted_and_the_audit_stays_clean(superuser, rows):
    done = make_job("succeeded", task=tasks_dlq.charge, kwargs={"order_id": 2, "amount": 5})
    assert delete_url(done) in change_page(superuser, done)
    response = superuser.post(delete_url(done), {"post": "yes"})
    assert response.status_code == 302
    assert not Job.objects.filter(pk=done.pk).exists()
    assert_audit_clean()


def test_bulk_deletion_of_jobs_refuses_a_selection_with_a_job_that_must_stay(superuser, rows):
    done = make_job("succeeded", task=tasks_dlq.charge, kwargs={"order_id": 3, "amount": 5})
    active = make_job("running", task=tasks_dlq.charge, kwargs={"order_id": 4, "amount": 5})
    url = changelist("job")
    assert 'value="delete_selected"' in superuser.get(url).content.decode()
    for step in ({}, {"post": "yes"}):  # the confirmation page, and its confirmation
        response = superuser.post(
            url, {"action": "delete_selected", "_selected_action": [done.pk, active.pk], **step}, follow=True
        )
        messages = [str(m) for m in response.context["messages"]]
        assert messages == [f"1 selected row may not be deleted, so nothing was: {JOB_DELETION_RULE}"]
        assert Job.objects.filter(pk__in=[done.pk, active.pk]).count() == 2
    confirm = superuser.post(url, {"action": "delete_selected", "_selected_action": [done.pk]})
    assert "Are you sure you want to delete the selected job?" in confirm.content.decode()
    superuser.post(url, {"action": "delete_selected", "_selected_action": [done.pk], "post": "yes"})
    assert not Job.objects.filter(pk=done.pk).exists()
    assert Job.objects.filter(pk=active.pk).exists()
    assert_audit_clean()


def test_keys_that_guard_an_action_are_not_deletable_and_the_others_are(superuser, rows):
    succeeded = IdempotencyKey.objects.get(key="refund:1")
    queued = tasks_dlq.charge.using(idempotency_key="charge:queued").enqueue(order_id=5, amount=5)
    owned = IdempotencyKey.objects.get(key="charge:queued")
    failed = IdempotencyKey.objects.get(key="charge:secret")  # its job is dead: a replay recreates it
    expired = IdempotencyKey.objects.create(
        key="old",
        scope="s",
        fingerprint="0" * 64,
        status="succeeded",
        expires_at=timezone.now() - datetime.timedelta(days=1),
    )
    for key in (succeeded, owned):
        assert delete_url(key) not in change_page(superuser, key)
        response = superuser.post(delete_url(key), {"post": "yes"})
        assert response.status_code == 403
        assert KEY_DELETION_RULE in response.content.decode()
    for key in (failed, expired):
        assert delete_url(key) in change_page(superuser, key)
        assert superuser.post(delete_url(key), {"post": "yes"}).status_code == 302
    assert set(IdempotencyKey.objects.values_list("key", flat=True)) == {"refund:1", "charge:queued"}
    assert Job.objects.filter(pk=queued.pk, idempotency_key="charge:queued").exists()
    assert_audit_clean()


def test_locks_are_still_not_deletable(superuser, rows):
    held = Lock.objects.get(key__endswith="order:secret")
    assert superuser.post(delete_url(held), {"post": "yes"}).status_code == 403
    assert Lock.objects.filter(pk=held.pk, token__isnull=False).exists()


def test_bulk_deletion_of_keys_deletes_nothing_when_one_selected_key_guards_an_action(superuser, rows):
    succeeded = IdempotencyKey.objects.get(key="refund:1")
    failed = IdempotencyKey.objects.get(key="charge:secret")
    url = changelist("idempotencykey")
    bulk = {"action": "delete_selected", "_selected_action": [succeeded.pk, failed.pk], "post": "yes"}
    response = superuser.post(url, bulk, follow=True)
    assert [str(m) for m in response.context["messages"]] == [
        f"1 selected row may not be deleted, so nothing was: {KEY_DELETION_RULE}"
    ]
    assert IdempotencyKey.objects.filter(pk__in=[succeeded.pk, failed.pk]).count() == 2
    superuser.post(url, {**bulk, "_selected_action": [failed.pk]})
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["refund:1"]
    assert_audit_clean()


def test_idempotency_keys_are_hidden_and_unsearchable_without_view_payload(client, rows, viewer, reader):
    client.force_login(viewer)
    url = changelist("idempotencykey")
    html = client.get(url).content.decode()
    assert "refund:1" not in html and "charge:secret" not in html
    assert "hidden: needs the view payload permission" in html
    assert 'id="searchbar"' not in html  # nothing left to search
    key = IdempotencyKey.objects.get(key="refund:1")
    key_page = reverse("admin:jobguard_idempotencykey_change", args=[key.pk])
    refused = client.get(key_page)
    assert refused.status_code == 403 and "refund:1" not in refused.content.decode()
    client.force_login(reader)
    assert client.get(url, {"q": "refund:1"}).context["cl"].result_count == 1
    assert "refund:1" in client.get(key_page).content.decode()
