"""The OpenAPI document: valid, complete, the docs generated from it; the API fuzzed against it."""

from __future__ import annotations

import base64
import importlib.util
import sys
from pathlib import Path

import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import ignored_auth, negative_data_rejection, positive_data_acceptance

from django_jobguard.api.schema import build_schema
from tests.support.factories import make_superuser

ROOT = Path(__file__).resolve().parents[2]
MOUNT = "/jobguard/api"

RAW = build_schema()
RAW["servers"] = [{"url": MOUNT}]
schema = schemathesis.openapi.from_dict(RAW)
schema.app = WSGIHandler()

EXPECTED_OPERATIONS = {
    ("get", "/jobs/"),
    ("post", "/jobs/"),
    ("get", "/jobs/{job_id}/"),
    ("post", "/jobs/{job_id}/cancel/"),
    ("post", "/jobs/{job_id}/retry/"),
    ("get", "/dead-letters/"),
    ("get", "/dead-letters/{letter_id}/"),
    ("post", "/dead-letters/{letter_id}/request-replay/"),
    ("post", "/dead-letters/{letter_id}/approve/"),
    ("post", "/dead-letters/{letter_id}/reject/"),
    ("get", "/queues/"),
    ("get", "/limits/"),
    ("get", "/breakers/"),
    ("post", "/breakers/{name}/open/"),
    ("post", "/breakers/{name}/close/"),
    ("get", "/workflows/{workflow_id}/"),
    ("post", "/workflows/{workflow_id}/cancel/"),
    ("post", "/workflows/{workflow_id}/retry-failed/"),
}


def test_every_endpoint_is_documented_with_bodies_and_errors():
    operations = {(method, path): op for path, item in RAW["paths"].items() for method, op in item.items()}
    assert set(operations) == EXPECTED_OPERATIONS
    for (method, path), op in operations.items():
        codes = set(op["responses"])
        assert {"401", "403"} <= codes, (method, path)
        assert any(code.startswith("2") for code in codes), (method, path)
        for code, response in op["responses"].items():
            media = "application/json" if code.startswith("2") else "application/problem+json"
            assert media in response["content"], (method, path, code)
        if method == "post":
            assert {"400", "429"} <= codes, (method, path)
        if "{" in path:
            assert "404" in codes, (method, path)
    assert "requestBody" in operations[("post", "/jobs/")]
    enqueue = operations[("post", "/jobs/")]
    assert "Idempotency-Key" in {p["name"] for p in enqueue["parameters"]}


@pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("sphinx", "docutils")),
    reason="needs the docs dependency group: pip install --group docs",
)
def test_the_reference_page_is_generated_from_the_schema():
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        from jobguard_api_docs import api_markdown
    finally:
        sys.path.pop(0)
    page = api_markdown(RAW)
    for method, path in EXPECTED_OPERATIONS:
        assert f"### `{method.upper()} {path.lstrip('/')}`" in page
    assert "**Permissions:** `jobguard.view_job`, `jobguard.cancel_job`." in page
    assert "| `Idempotency-Key` | header |" in page
    assert "### Object `Job`" in page and "| `args` |" in page


@pytest.fixture
def admin_auth(settings):
    settings.ALLOWED_HOSTS = ["localhost"]  # schemathesis's WSGI transport sends Host: localhost
    make_superuser("fuzz", password="fuzz-password")  # noqa: S106
    # As Django's test client does: the WSGI handler must not close the test's connection
    # (and its transaction) at the end of each request.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield {"Authorization": "Basic " + base64.b64encode(b"fuzz:fuzz-password").decode()}
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.mark.django_db
@schema.parametrize()
@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    database=None,  # deterministic examples; nothing written to .hypothesis/
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
def test_the_api_answers_every_generated_request_by_its_schema(case, admin_auth):
    negative = {
        str(location.value)
        for location, info in case.meta.components.items()
        if info.mode == GenerationMode.NEGATIVE
    }
    if (
        case.method == "POST"
        and case.path == "/jobs/"
        and isinstance(case.body, dict)
        and "task" in case.body
        and "body" not in negative
    ):
        # A made-up task name is refused before anything is stored; every other case names a
        # task that binds any arguments, so the made-up payloads go all the way to the insert.
        # Not in a body made invalid on purpose: the task may be what makes it invalid.
        case.body["task"] = "tests.api_anything"
    excluded = [ignored_auth, positive_data_acceptance]
    if negative <= {"header"} and not set(case.headers or {}) - {"Authorization"}:
        # The only invalid part was the Authorization header, and the valid one we pass
        # replaces it: the request sent is valid, so its acceptance is no finding.
        excluded.append(negative_data_rejection)
    # No 500 and every response as documented (status, content type, body, headers).
    # ignored_auth is left out: it replays the request with made-up credentials, but the valid
    # Basic header we pass rides along and rightly wins. Denied users are tested endpoint by
    # endpoint in test_jobs.py, test_enqueue.py and test_dead_letters.py.
    # positive_data_acceptance is left out: a schema cannot say which task names are
    # registered or which arguments bind to them, so a schema-valid body may rightly get 400
    # (test_enqueue.py asserts those answers one by one).
    case.call_and_validate(headers=admin_auth, excluded_checks=excluded)


# -- what the document promises of fields a user may not see, and of refused input ----------------

PAYLOAD_NOTE = "Omitted without the jobguard.view_payload permission."


def test_fields_left_out_without_view_payload_are_not_required_and_say_so():
    from django_jobguard.api.serializers import (
        DeadLetterDetailSerializer,
        DeadLetterSerializer,
        JobSerializer,
    )

    components = RAW["components"]["schemas"]
    for name, serializer in (
        ("Job", JobSerializer),
        ("DeadLetter", DeadLetterSerializer),
        ("DeadLetterDetail", DeadLetterDetailSerializer),
    ):
        component = components[name]
        hidden = set(serializer.payload_fields)
        assert hidden <= set(component["properties"]), name
        assert not hidden & set(component.get("required", [])), name
        for field in hidden:
            assert PAYLOAD_NOTE in component["properties"][field]["description"], (name, field)
        # The rest stays required: only what may be left out is optional.
        assert {"id", "task_name"} <= set(component["required"]), name


@pytest.mark.django_db(transaction=True)  # dead_charge runs a worker in this process
def test_a_reader_without_view_payload_gets_every_field_the_document_requires():
    from tests.api.support import BASE, as_user
    from tests.support.dlq import dead_charge

    letter = dead_charge(order_id=3, amount=0)
    reader, _ = as_user("reader", "view_job", "view_deadletter")
    components = RAW["components"]["schemas"]
    job = reader.get(f"{BASE}jobs/{letter.job_id}/")
    assert job.status_code == 200, job.content
    assert "args" not in job.json() and "last_error" not in job.json()
    assert set(components["Job"]["required"]) <= set(job.json())
    detail = reader.get(f"{BASE}dead-letters/{letter.pk}/")
    assert detail.status_code == 200, detail.content
    assert "error_message" not in detail.json()
    assert set(components["DeadLetterDetail"]["required"]) <= set(detail.json())


def test_the_enqueue_body_says_what_is_refused():
    body = RAW["components"]["schemas"]["EnqueueRequest"]["properties"]
    for name in ("args", "kwargs"):
        text = body[name]["description"]
        assert "null" in text and "NUL character (U+0000)" in text and "400" in text, name
    assert "unknown_task" in body["task"]["description"]
    assert "api=True" in body["task"]["description"]
