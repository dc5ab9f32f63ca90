"""Durable invalidation: the keys of a transaction in one job, inserted in that transaction.

Local memory by default; the tests taking ``alias`` run on the django-redis alias "redis"
too when ``JOBGUARD_TEST_REDIS_URL`` is set. The worker's side runs in real worker
processes in tests/processes/test_cache_processes.py; here its task is called directly.
"""

from __future__ import annotations

import socket
import uuid

import pytest
from django.conf import settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import override_settings
from prometheus_client import REGISTRY

from django_jobguard import conf
from django_jobguard.cache import delete_keys, get_versioned, invalidate, invalidates, set_versioned
from django_jobguard.context import JobContext
from django_jobguard.exceptions import TransientError
from django_jobguard.models import Job
from django_jobguard.registry import registry
from tests.testapp.models import Account

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "django_jobguard.cache.delete_keys"


@pytest.fixture(params=["default", pytest.param("redis", marks=pytest.mark.redis)])
def alias(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def key() -> str:
    return f"test:durable:{uuid.uuid4().hex}"


def durable_jobs() -> list[Job]:
    return list(Job.objects.filter(task_name=TASK).order_by("pk"))


def durable_count(alias: str, status: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "jobguard_cache_durable_invalidations_total", {"cache": alias, "status": status}
        )
        or 0
    )


def test_the_job_exists_inside_the_transaction_and_is_removed_once_the_keys_went(alias, key):
    cache = caches[alias]
    cache.set_many({key: 1, key + ":b": 1, key + ":c": 1})
    completed = durable_count(alias, "completed_at_commit")
    with transaction.atomic():
        Account.objects.create(owner="durable")
        invalidate(key, key + ":b", cache_alias=alias, durable=True)
        invalidate(key + ":c", key, cache_alias=alias, durable=True)
        (job,) = durable_jobs()  # coalesced: one job for the whole transaction
        assert job.queue_name == "jobguard.cache"
        assert job.max_attempts == 20
        assert job.kwargs == {"keys": {alias: {key: None, key + ":b": None, key + ":c": None}}}
        assert cache.get(key) == 1
    assert cache.get_many([key, key + ":b", key + ":c"]) == {}
    assert durable_jobs() == []  # the fast path deleted the job: nothing left for a worker
    assert durable_count(alias, "completed_at_commit") - completed == 1


def test_durable_invalidations_work_when_the_project_declares_its_queues(key):
    """The cache queue is the package's own: declaring QUEUES must not refuse its jobs."""
    strict = {**settings.JOBGUARD, "ALLOW_UNDECLARED_QUEUES": False, "QUEUES": {"payments": {}}}
    cache = caches["default"]
    cache.set(key, 1)
    with override_settings(JOBGUARD=strict), transaction.atomic():
        invalidate(key, durable=True)
        (job,) = durable_jobs()
        assert job.queue_name == "jobguard.cache"
    assert cache.get(key) is None


def test_a_rollback_enqueues_nothing(key):
    caches["default"].set(key, "current")
    with pytest.raises(RuntimeError, match="write failed"), transaction.atomic():
        Account.objects.create(owner="a")
        invalidate(key, durable=True)
        assert len(durable_jobs()) == 1
        raise RuntimeError("write failed")
    assert durable_jobs() == []
    assert caches["default"].get(key) == "current"


def test_a_rolled_back_savepoint_with_the_job_in_it_never_loses_the_later_keys(key):
    # The job is inserted inside the savepoint that rolls back: the next durable call in the
    # outer transaction must start a new job, or the outer keys would have no job at all.
    cache = caches["default"]
    names = [key + suffix for suffix in (":inner", ":outer", ":released", ":rolled-back")]
    cache.set_many(dict.fromkeys(names, "old"))
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            invalidate(key + ":inner", durable=True)
            raise RuntimeError("inner block fails")
        assert durable_jobs() == []
        invalidate(key + ":outer", durable=True)
        with transaction.atomic():  # released: its keys join the job
            invalidate(key + ":released", durable=True)
        with pytest.raises(RuntimeError), transaction.atomic():
            invalidate(key + ":rolled-back", durable=True)  # its UPDATE of the job rolls back
            raise RuntimeError("second inner block fails")
        (job,) = durable_jobs()
        assert sorted(job.kwargs["keys"]["default"]) == [key + ":outer", key + ":released"]
    # The keys of the first rolled-back savepoint are not deleted; those of the second may be
    # (deleting more than needed is harmless, the next read refills); the others are gone.
    assert cache.get(key + ":inner") == "old"
    assert cache.get_many([key + ":outer", key + ":released"]) == {}
    assert durable_jobs() == []


def dead_redis() -> dict[str, object]:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://127.0.0.1:{port}/0",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
    }


@pytest.fixture
def dead_alias():
    with override_settings(CACHES={**settings.CACHES, "dead": dead_redis()}):
        yield "dead"


def test_when_the_cache_fails_at_commit_the_job_stays_for_a_worker_with_every_key(dead_alias, key, caplog):
    with transaction.atomic():
        Account.objects.create(owner="committed")
        invalidate(key, cache_alias=dead_alias, durable=True)
        invalidate(key + ":v", version=4, cache_alias=dead_alias, durable=True)
        invalidate(key + ":local", durable=True)  # another cache alias, same job
    (job,) = durable_jobs()
    assert job.status == "queued"
    assert job.kwargs == {"keys": {dead_alias: {key: None, key + ":v": 4}, "default": {key + ":local": None}}}
    messages = [r.getMessage() for r in caplog.records]
    assert (
        f"durable_invalidation_deferred job_id={job.pk} caches=['dead', 'default']; "
        "a worker on queue jobguard.cache deletes the keys"
    ) in messages
    # The worker's task meets the same dead cache: a transient error, so the job is retried.
    context = JobContext(task=delete_keys, job_id=job.pk, attempt=1, max_attempts=20, queue_name="q")
    retried, failed = durable_count(dead_alias, "retried"), durable_count(dead_alias, "failed")
    with pytest.raises(
        TransientError, match=f"cache 'dead' did not take the invalidation of job {job.pk} \\(Connection"
    ):
        delete_keys.func(context, **job.kwargs)
    assert durable_count(dead_alias, "retried") - retried == 1
    last = JobContext(task=delete_keys, job_id=job.pk, attempt=20, max_attempts=20, queue_name="q")
    with pytest.raises(TransientError):
        delete_keys.func(last, **job.kwargs)
    assert durable_count(dead_alias, "failed") - failed == 1


def test_the_workers_task_deletes_plain_keys_and_writes_tombstones(alias, key):
    cache = caches[alias]
    cache.set(key, "old")
    assert set_versioned(key + ":v", "r3", 3, cache_alias=alias)
    context = JobContext.detached(delete_keys)
    assert delete_keys.func(context, keys={alias: {key: None, key + ":v": 5}}) == 2
    assert cache.get(key) is None
    assert get_versioned(key + ":v", cache_alias=alias) is None
    assert set_versioned(key + ":v", "r4", 4, cache_alias=alias) is False  # the tombstone holds
    assert set_versioned(key + ":v", "r5", 5, cache_alias=alias) is True


def test_in_autocommit_the_keys_go_at_once_and_the_job_with_them(key):
    caches["default"].set(key, "old")
    invalidate(key, durable=True)
    assert caches["default"].get(key) is None
    assert durable_jobs() == []


def test_the_task_is_registered_when_the_app_loads():
    assert registry.get(TASK) is delete_keys


def test_the_setting_makes_invalidations_and_declarations_durable(key):
    declaration = invalidates(Account, key + ":{pk}")
    try:
        with override_settings(JOBGUARD={**settings.JOBGUARD, "CACHE": {"DURABLE": True, "QUEUE": "inval"}}):
            with transaction.atomic():
                account = Account.objects.create(owner="decl")
                invalidate(key + ":explicit")
                invalidate(key + ":not-durable", durable=False)
                (job,) = durable_jobs()
                assert job.queue_name == "inval"
                assert sorted(job.kwargs["keys"]["default"]) == sorted(
                    [f"{key}:{account.pk}", key + ":explicit"]
                )
    finally:
        declaration.disconnect()
    assert durable_jobs() == []


def test_a_durable_invalidation_of_a_write_on_another_database_is_refused(key):
    with pytest.raises(
        ValueError,
        match=r"the write must run on JOBGUARD\['DATABASE_ALIAS'\] \('default'\), not on 'other'",
    ):
        invalidate(key, using="other", durable=True)
    with pytest.raises(ValueError, match="durable is True, False or None, not 'yes'"):
        invalidate(key, durable="yes")  # type: ignore[arg-type]
    assert durable_jobs() == []


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"CACHE": {"DURABLE": 1}}, "JOBGUARD['CACHE']['DURABLE'] must be True or False, not 1"),
        ({"CACHE": {"QUEUE": ""}}, "JOBGUARD['CACHE']['QUEUE'] must be a non-empty string"),
        ({"CACHE": {"QUEUE": "q" * 101}}, "JOBGUARD['CACHE']['QUEUE'] must be at most 100 characters"),
        (
            {"CACHE": {"MAX_ATTEMPTS": 0}},
            "JOBGUARD['CACHE']['MAX_ATTEMPTS'] must be an integer of at least 1",
        ),
        ({"CACHE": {"DURABLE_DELAY": -1}}, "JOBGUARD['CACHE']['DURABLE_DELAY'] must be at least 0"),
        ({"CACHE": {"REFILL_LEASE_TTL": 0}}, "JOBGUARD['CACHE']['REFILL_LEASE_TTL'] must be more than 0"),
        ({"CACHE": {"REFILL_WAIT": "1"}}, "JOBGUARD['CACHE']['REFILL_WAIT'] must be a number of seconds"),
    ],
)
def test_invalid_durable_and_refill_settings_name_the_key(raw, named):
    with pytest.raises(ImproperlyConfigured, match=named.replace("[", r"\[").replace("]", r"\]")):
        conf.parse(raw)


def test_the_fast_path_leaves_a_job_a_worker_already_claimed(key):
    from django.db.models.functions import Now

    from django_jobguard import store

    with transaction.atomic():
        invalidate(key, durable=True, cache_alias="files")
        (job,) = durable_jobs()
        # A worker claimed it between the commit and the on_commit callback.
        Job.objects.filter(pk=job.pk).update(status="running", lease_token="a" * 32, lease_expires_at=Now())
    assert [j.status for j in durable_jobs()] == ["running"]  # the worker's ack settles it
    store.discard_queued("default", job.pk)
    assert [j.pk for j in durable_jobs()] == [job.pk]


@pytest.mark.postgres
def test_the_fast_paths_unsynchronised_commit_does_not_leak_into_the_session(key):
    from django.db import connection

    invalidate(key, durable=True)
    with transaction.atomic():
        invalidate(key + ":tx", durable=True)
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone() == ("on",)
    assert durable_jobs() == []


def test_the_check_warns_when_durable_is_the_default_but_jobs_live_on_another_database():
    from django.core.checks import run_checks

    def w020() -> list[str]:
        return [m.msg for m in run_checks() if m.id == "jobguard.W020"]

    assert w020() == []
    with override_settings(JOBGUARD={**settings.JOBGUARD, "CACHE": {"DURABLE": True}}):
        assert w020() == []
    jobs_db = {**settings.JOBGUARD, "DATABASE_ALIAS": "jobs", "CACHE": {"DURABLE": True}}
    with override_settings(JOBGUARD=jobs_db):  # E002 reports the missing alias; W020 the rest
        assert w020() == [
            "JOBGUARD['CACHE']['DURABLE'] is True, but JOBGUARD['DATABASE_ALIAS'] is 'jobs': an "
            "invalidate() of a write on 'default' cannot put its job in that write's transaction, and "
            "raises ValueError."
        ]


@pytest.mark.postgres
def test_a_delayed_durable_job_wakes_no_worker_and_a_due_one_does(key):
    # Every durable write inserts a job that waits CACHE.DURABLE_DELAY: a NOTIFY for it would
    # wake every idle worker for a claim that finds nothing (migration 0013).
    from django_jobguard.store import Listener

    listener = Listener("default", ["jobguard.cache"])
    try:
        assert listener.start()
        with transaction.atomic():
            invalidate(key, durable=True)
        # Delivered at the commit if it was sent at all: it would be waiting on the socket now.
        assert listener.wait(1.0) is False
        with override_settings(JOBGUARD={**settings.JOBGUARD, "CACHE": {"DURABLE_DELAY": 0}}):
            with transaction.atomic():
                invalidate(key, durable=True)
        assert listener.wait(30.0) is True
    finally:
        listener.close()
