"""POST jobs/: enqueue over HTTP, its validation (400 naming the field) and the Idempotency-Key header."""

from __future__ import annotations

import datetime
import re
import threading

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_jobguard.exceptions import IdempotencyScheduleConflict
from django_jobguard.models import IdempotencyKey, Job
from tests.api.support import BASE, as_user, client_for
from tests.conftest import ON_SERVER_DB
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

JOBS = BASE + "jobs/"
ADD = "tests.testapp.tasks.api_add"


@pytest.fixture
def producer():
    client, _ = as_user("producer", "add_job")
    return client


def post(client, body, **headers):
    return client.post(JOBS, body, format="json", headers=headers)


def assert_problem(response, status: int, field: str, *words: str) -> None:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status
    assert field in body["errors"], body
    message = " ".join(body["errors"][field])
    for word in words:
        assert word in message, message
    assert Job.objects.count() == 0


def test_enqueue_creates_the_job_with_201(producer):
    when = (timezone.now() + datetime.timedelta(days=30)).replace(microsecond=0)
    run_after = when.astimezone(datetime.timezone(datetime.timedelta(hours=1))).isoformat()
    response = post(
        producer,
        {
            "task": ADD,
            "args": [2],
            "kwargs": {"b": 3},
            "queue_name": "slow",
            "priority": 7,
            "run_after": run_after,
        },
    )
    assert response.status_code == 201, response.content
    job = Job.objects.get()
    assert (job.task_name, job.args, job.kwargs, job.queue_name, job.priority) == (
        ADD,
        [2],
        {"b": 3},
        "slow",
        7,
    )
    assert job.run_after == when
    # The producer may enqueue, not read jobs back: the id and the state, nothing else.
    assert response.json() == {"id": job.pk, "status": "queued"}


def test_an_unknown_task_and_a_task_without_api_true_get_one_answer(producer):
    # A caller cannot tell a registered task it may not call from a name nobody registered:
    # the same status, code and message, but for the name it sent.
    answers = []
    for name in ("tests.testapp.tasks.add", "nope.missing"):
        response = post(producer, {"task": name, "args": [1]})
        assert_problem(response, 400, "task", repr(name), "not available through the API")
        body = response.json()
        answers.append((response.status_code, body["code"], body["detail"].replace(name, "NAME")))
        assert body["errors"] == {"task": [f"Task {name!r} is not available through the API."]}
    assert answers[0] == answers[1]
    assert answers[0][1] == "unknown_task"


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"task": ADD}, "args", ["'a'"]),
        ({"task": ADD, "args": [1, 2, 3]}, "args", ["too many positional"]),
        ({"task": ADD, "args": [1], "kwargs": {"c": 1}}, "kwargs", ["'c'"]),
        ({"task": ADD, "args": {"a": 1}}, "args", ["list"]),
        ({"task": ADD, "args": [1], "kwargs": [1]}, "kwargs", ["dictionary"]),
        ({"task": ADD, "args": [1], "run_after": "2031-01-02T03:04:05"}, "run_after", ["UTC offset"]),
        ({"task": ADD, "args": [1], "run_after": "next tuesday"}, "run_after", ["ISO 8601"]),
        ({"task": ADD, "args": [1], "priority": 101}, "priority", ["100"]),
        ({"task": ADD, "args": [1], "priority": -101}, "priority", ["-100"]),
        ({"task": ADD, "args": ["a\x00b"]}, "args", ["NUL"]),
        ({"args": [1]}, "task", ["required"]),
    ],
)
def test_bad_input_is_400_naming_the_field_and_writes_nothing(producer, body, field, words):
    assert_problem(post(producer, body), 400, field, *words)


def test_arguments_that_do_not_fit_are_told_once_under_both_fields(producer):
    response = post(producer, {"task": ADD, "kwargs": {"b": 1, "c": 2}})
    assert_problem(response, 400, "kwargs", "unexpected keyword argument 'c'")
    body = response.json()
    assert body["errors"]["args"] == body["errors"]["kwargs"]
    # The detail names both fields and gives the message once, not twice.
    message = body["errors"]["args"][0]
    assert body["detail"] == f"args, kwargs: {message}"


def test_a_body_that_is_not_json_is_400(producer):
    response = producer.post(JOBS, b'{"task": ', content_type="application/json")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert "not valid JSON" in response.json()["detail"]
    assert Job.objects.count() == 0


def test_a_body_of_another_content_type_is_415(producer):
    response = producer.post(JOBS, "task=x", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert Job.objects.count() == 0


@override_settings(JOBGUARD={"API": {"MAX_PAYLOAD_BYTES": 1000}})
def test_a_payload_over_the_size_limit_is_400(producer):
    assert_problem(
        post(producer, {"task": ADD, "args": ["x" * 1200]}), 400, "args", "1000", "MAX_PAYLOAD_BYTES"
    )


@override_settings(JOBGUARD={"API": {"MAX_PAYLOAD_BYTES": 1000}})
def test_a_body_far_over_the_limit_is_refused_before_parsing(producer):
    response = post(producer, {"task": ADD, "args": ["x" * 40_000]})
    assert response.status_code == 400
    assert "larger than" in response.json()["detail"]
    assert Job.objects.count() == 0


@override_settings(JOBGUARD={"API": {"MAX_DEPTH": 5}})
def test_a_payload_nested_deeper_than_the_limit_is_400(producer):
    nested: list = [1]
    for _ in range(4):
        nested = [nested]
    assert_problem(post(producer, {"task": ADD, "args": [nested]}), 400, "args", "deeper than 5")


def test_a_body_nested_a_million_deep_is_400_not_a_crash(producer):
    body = b'{"task": "x", "args": ' + b"[" * 1_000_000 + b"]" * 1_000_000 + b"}"
    with override_settings(JOBGUARD={"API": {"MAX_PAYLOAD_BYTES": 4_000_000}}):
        response = producer.post(JOBS, body, content_type="application/json")
    assert response.status_code == 400
    assert "nested deeper" in response.json()["detail"]
    assert Job.objects.count() == 0


def test_the_same_key_and_body_return_the_same_job_with_200(producer):
    body = {"task": ADD, "args": [1], "kwargs": {"b": 2}}
    first = post(producer, body, **{"Idempotency-Key": "order-7"})
    again = post(producer, {"task": ADD, "kwargs": {"a": 1, "b": 2}}, **{"Idempotency-Key": "order-7"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    # Kept in the caller's own namespace, apart from the keys the application derives.
    user_id = first.wsgi_request.user.pk
    assert Job.objects.get().idempotency_key == f"api:user:{user_id}:order-7"
    assert IdempotencyKey.objects.get().duplicates == 1


@pytest.mark.parametrize("change", [{"args": [2]}, {"priority": 5}, {"queue_name": "slow"}])
def test_the_same_key_with_another_body_is_409_naming_the_key(producer, change):
    body = {"task": ADD, "args": [1]}
    assert post(producer, body, **{"Idempotency-Key": "order-8"}).status_code == 201
    response = post(producer, {**body, **change}, **{"Idempotency-Key": "order-8"})
    assert response.status_code == 409, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert "'order-8'" in response.json()["detail"]
    assert response.json()["code"] == "idempotency_conflict"
    assert Job.objects.count() == 1


def test_a_malformed_idempotency_key_is_400(producer):
    assert_problem(
        post(producer, {"task": ADD, "args": [1]}, **{"Idempotency-Key": "x" * 256}), 400, "Idempotency-Key"
    )


def test_without_add_job_enqueue_is_403_and_writes_nothing():
    reader, _ = as_user("reader", "view_job")
    response = post(reader, {"task": ADD, "args": [1]})
    assert response.status_code == 403
    assert response["Content-Type"] == "application/problem+json"
    assert client_for(None).post(JOBS, {"task": ADD, "args": [1]}, format="json").status_code in (401, 403)
    assert Job.objects.count() == 0


@override_settings(JOBGUARD={"API": {"ENQUEUE_THROTTLE_RATE": "2/minute"}})
def test_enqueue_is_throttled_at_the_configured_rate(producer):
    codes = [post(producer, {"task": ADD, "args": [n]}).status_code for n in range(3)]
    assert codes == [201, 201, 429]
    assert Job.objects.count() == 2


def _enqueue_from_threads(user, count: int) -> list[tuple[int, int]]:
    barrier = threading.Barrier(count)
    answers: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            client = client_for(user)
            barrier.wait(timeout=60)
            response = post(client, {"task": ADD, "args": [5]}, **{"Idempotency-Key": "pay:5"})
            answers.append((response.status_code, response.json().get("id")))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=produce) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return answers


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(ON_SERVER_DB, reason="the SQLite run of the test below")
def test_eight_clients_with_one_key_create_one_job_on_sqlite():
    _, user = as_user("producer", "add_job")
    _check_one_job(_enqueue_from_threads(user, 8))


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_eight_clients_with_one_key_create_one_job_on_a_database_server():
    _, user = as_user("producer", "add_job")
    _check_one_job(_enqueue_from_threads(user, 8))


def _check_one_job(answers: list[tuple[int, int]]) -> None:
    assert len(answers) == 8
    assert sorted(code for code, _ in answers) == [200] * 7 + [201], answers
    assert len({job_id for _, job_id in answers}) == 1
    job = Job.objects.get()
    assert job.idempotency_key.endswith(":pay:5") and job.idempotency_key.startswith("api:user:")
    assert IdempotencyKey.objects.get(key=job.idempotency_key).duplicates == 7


KEYED = "tests.testapp.tasks.api_charge"


def test_a_header_cannot_override_a_tasks_key_template():
    # Three retries with fresh header values: one job, keyed by the template.
    debugger, _ = as_user("debugger", "add_job", "view_job", "view_payload")
    body = {"task": KEYED, "kwargs": {"order_id": 7}}
    first = post(debugger, body)
    assert first.status_code == 201, first.content
    for header in ("retry-1", "retry-2", "retry-3"):
        assert_problem_kept(post(debugger, body, **{"Idempotency-Key": header}), "Idempotency-Key", "charge:")
    again = post(debugger, body, **{"Idempotency-Key": "charge:order:7"})
    assert again.status_code == 200, again.content
    assert again.json()["id"] == first.json()["id"]
    assert list(Job.objects.values_list("idempotency_key", flat=True)) == ["charge:order:7"]


SHARED = "tests.testapp.tasks.api_charge_amount"


def test_a_shared_key_tells_a_caller_without_view_payload_nothing_of_another_jobs_arguments():
    # The application charged order 6 for 100; the key, charge-amount:order:6, leaves the amount out.
    own = tasks.api_charge_amount.enqueue(order_id=6, amount=100)
    prober, _ = as_user("prober", "add_job", "view_job")
    right = post(prober, {"task": SHARED, "kwargs": {"order_id": 6, "amount": 100}})
    wrong = post(prober, {"task": SHARED, "kwargs": {"order_id": 6, "amount": 999}})
    later = (timezone.now() + datetime.timedelta(days=3)).isoformat()
    scheduled = post(prober, {"task": SHARED, "kwargs": {"order_id": 6, "amount": 100}, "run_after": later})
    # One answer whatever was guessed: the same 409, no job id, no arguments.
    assert (right.status_code, wrong.status_code, scheduled.status_code) == (409, 409, 409)
    assert right.json() == wrong.json() == scheduled.json()
    assert right.json()["code"] == "idempotency_conflict"
    assert "'charge-amount:order:6'" in right.json()["detail"]
    assert "view_payload" in right.json()["detail"]
    # No job id: the only numbers in the answer are its status and the key's own.
    detail = right.json()["detail"].replace("'charge-amount:order:6'", "")
    assert "id" not in right.json() and str(own.pk) not in re.findall(r"\d+", detail)
    assert Job.objects.count() == 1
    # A user who may read payloads could read the job anyway: the usual answers.
    debugger, _ = as_user("debugger", "add_job", "view_job", "view_payload")
    same = post(debugger, {"task": SHARED, "kwargs": {"order_id": 6, "amount": 100}})
    assert (same.status_code, same.json()["id"]) == (200, own.pk)
    other = post(debugger, {"task": SHARED, "kwargs": {"order_id": 6, "amount": 999}})
    assert other.status_code == 409
    assert "different arguments" in other.json()["detail"]


def test_a_callers_own_repeat_of_a_shared_key_is_the_same_409_without_view_payload(producer):
    body = {"task": SHARED, "kwargs": {"order_id": 8, "amount": 5}}
    assert post(producer, body).status_code == 201
    again = post(producer, body)
    assert again.status_code == 409, again.content
    assert again.json() == post(producer, {**body, "kwargs": {"order_id": 8, "amount": 6}}).json()
    assert Job.objects.count() == 1


def test_the_application_does_not_fold_onto_a_job_a_caller_scheduled_far_ahead(producer):
    year = (timezone.now() + datetime.timedelta(days=360)).isoformat()
    body = {"task": SHARED, "kwargs": {"order_id": 6, "amount": 100}, "run_after": year}
    assert post(producer, body).status_code == 201
    with pytest.raises(IdempotencyScheduleConflict, match="SCHEDULE_TOLERANCE"):
        tasks.api_charge_amount.enqueue(order_id=6, amount=100)
    assert Job.objects.count() == 1
    assert IdempotencyKey.objects.get().duplicates == 0


def assert_problem_kept(response, field, *words):
    """A 400 naming ``field`` that wrote nothing new."""
    assert response.status_code == 400, response.content
    message = " ".join(response.json()["errors"][field])
    for word in words:
        assert word in message, message


def test_a_caller_cannot_claim_a_key_the_application_derives_later(producer):
    post(producer, {"task": ADD, "args": [1]}, **{"Idempotency-Key": "receipt:order:9"})
    job = tasks.api_add.using(idempotency_key="receipt:order:9").enqueue(1)
    # The application's own enqueue is its own job, not the caller's.
    assert Job.objects.count() == 2
    assert job.idempotency_key == "receipt:order:9"


def test_two_callers_keys_never_meet():
    alice, _ = as_user("alice", "add_job", "view_job")
    bob, _ = as_user("bob", "add_job")
    first = post(alice, {"task": ADD, "args": [1]}, **{"Idempotency-Key": "k"})
    second = post(bob, {"task": ADD, "args": [1]}, **{"Idempotency-Key": "k"})
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["id"] != second.json()["id"]
    assert "task_name" in first.json()  # alice may read jobs
    assert set(second.json()) == {"id", "status"}  # bob may not


def test_run_after_is_part_of_an_idempotent_requests_identity(producer):
    later = (timezone.now() + datetime.timedelta(days=200)).isoformat()
    assert (
        post(producer, {"task": ADD, "args": [1], "run_after": later}, **{"Idempotency-Key": "r"}).status_code
        == 201
    )
    response = post(producer, {"task": ADD, "args": [1]}, **{"Idempotency-Key": "r"})
    assert response.status_code == 409, response.content
    assert "later than this enqueue asks" in response.json()["detail"]
    assert "'r'" in response.json()["detail"]  # the key the caller sent, not its namespaced form
    # Within the tolerance, a repeat must still ask for the same run_after.
    soon = (timezone.now() + datetime.timedelta(seconds=90)).isoformat()
    assert (
        post(producer, {"task": ADD, "args": [2], "run_after": soon}, **{"Idempotency-Key": "s"}).status_code
        == 201
    )
    response = post(producer, {"task": ADD, "args": [2]}, **{"Idempotency-Key": "s"})
    assert response.status_code == 409, response.content
    assert "run after" in response.json()["detail"]
    assert Job.objects.count() == 2


@pytest.mark.parametrize(
    "value",
    [
        "9999-12-31T23:59:59-23:59",
        "0001-01-01T00:00:00+23:59",
        "2999-01-01T00:00:00Z",
        "2000-01-01T00:00:00Z",
    ],
)
def test_run_after_outside_the_window_is_400_naming_the_field(producer, value):
    assert_problem(post(producer, {"task": ADD, "args": [1], "run_after": value}), 400, "run_after")


@override_settings(JOBGUARD={"API": {"RUN_AFTER_FUTURE": 5 * 365 * 24 * 3600.0}})
def test_the_run_after_window_is_configurable(producer):
    later = (timezone.now() + datetime.timedelta(days=3 * 365)).isoformat()
    assert post(producer, {"task": ADD, "args": [1], "run_after": later}).status_code == 201


def test_an_undeclared_queue_is_refused_through_the_api_even_where_python_allows_it(producer):
    # The suite allows free-form queue names in Python (ALLOW_UNDECLARED_QUEUES).
    assert_problem(
        post(producer, {"task": ADD, "args": [1], "queue_name": "tenant-42"}), 400, "queue_name", "slow"
    )
    assert post(producer, {"task": ADD, "args": [1], "queue_name": "slow"}).status_code == 201


# -- what a caller may choose: queue and priority are the task author's to open -------------------

NOTIFY = "tests.testapp.tasks.api_notify"  # @task(api=True, queue_name="slow")
REPORT = "tests.testapp.tasks.api_report"  # @task(api={"max_priority": 10}, priority=2)


@pytest.mark.parametrize(
    ("task_name", "body", "field", "words"),
    [
        (NOTIFY, {"queue_name": "default"}, "queue_name", ["'slow'", "queue_name': True"]),
        (NOTIFY, {"priority": 1}, "priority", ["at most 0", "not 1"]),
        (NOTIFY, {"priority": 100}, "priority", ["at most 0", "not 100"]),
        (REPORT, {"priority": 11}, "priority", ["at most 10"]),
        (REPORT, {"queue_name": "slow"}, "queue_name", ["'default'"]),
    ],
)
def test_a_queue_or_priority_the_task_does_not_open_is_400_naming_the_field(
    producer, task_name, body, field, words
):
    args = [7] if task_name == NOTIFY else ["2030-01"]
    assert_problem(post(producer, {"task": task_name, "args": args, **body}), 400, field, *words)


def test_a_caller_may_keep_the_tasks_queue_and_lower_its_priority(producer):
    assert post(producer, {"task": NOTIFY, "args": [7], "queue_name": "slow"}).status_code == 201
    assert post(producer, {"task": NOTIFY, "args": [8], "priority": -20}).status_code == 201
    assert post(producer, {"task": NOTIFY, "args": [9], "priority": 0}).status_code == 201
    assert sorted(Job.objects.values_list("queue_name", "priority")) == [
        ("slow", -20),
        ("slow", 0),
        ("slow", 0),
    ]


def test_a_task_may_open_priorities_up_to_its_max_priority(producer):
    assert post(producer, {"task": REPORT, "args": ["2030-01"]}).status_code == 201
    assert post(producer, {"task": REPORT, "args": ["2030-02"], "priority": 10}).status_code == 201
    assert sorted(Job.objects.values_list("priority", flat=True)) == [2, 10]


# -- lock keys made from what the caller sends ------------------------------------------------------

RENDER = "tests.testapp.tasks.api_render"  # @task(api=True, lock="document:{document_id}")


@pytest.mark.parametrize(
    ("document_id", "words"),
    [
        ("x" * 300, ["309 characters", "1 to 241"]),
        ("a:fencing", ["':fencing'"]),
    ],
)
def test_a_lock_key_the_lock_cannot_hold_is_400_naming_the_arguments(producer, document_id, words):
    # Before, a key over the column's 255 characters failed the INSERT on PostgreSQL: a 500.
    response = post(producer, {"task": RENDER, "kwargs": {"document_id": document_id}})
    assert_problem(response, 400, "kwargs", "lock template 'document:{document_id}'", *words)
    assert response.json()["errors"]["args"] == response.json()["errors"]["kwargs"]


def test_a_lock_key_at_the_limit_is_accepted(producer):
    longest = "x" * (255 - len("jobguard:lock:") - len("document:"))
    assert post(producer, {"task": RENDER, "kwargs": {"document_id": longest}}).status_code == 201
    assert Job.objects.get().lock_key == f"document:{longest}"
