"""Dead letters and the replay flow over HTTP: permissions, the two-person rule, payload hiding."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobguard import dlq
from django_jobguard.models import DeadLetter, Job, ReplayEvent
from tests.api.support import BASE, client_for
from tests.support.dlq import dead_charge, replay_jobs, run_burst
from tests.support.factories import make_user

# A worker (threads) makes the dead letters, so the rows must be committed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def people():
    users = SimpleNamespace(
        requester=make_user("rita", "request_replay", "view_payload", "view_deadletter"),
        approver=make_user("amir", "approve_replay", "view_deadletter"),
        viewer=make_user("vic", "view_deadletter"),
        blind=make_user("bob", "request_replay", "view_deadletter"),
        outsider=make_user("olga", "request_replay", "approve_replay", "view_payload"),
    )
    return SimpleNamespace(**{name: client_for(user) for name, user in vars(users).items()}, users=users)


def url(letter: DeadLetter, action: str = "") -> str:
    return f"{BASE}dead-letters/{letter.pk}/" + (f"{action}/" if action else "")


def state(letter: DeadLetter) -> tuple:
    letter.refresh_from_db()
    return (
        letter.replay_state,
        letter.replay_args,
        letter.replay_kwargs,
        letter.replay_decided_by_id,
        ReplayEvent.objects.filter(dead_letter=letter).count(),
        Job.objects.count(),
    )


def test_request_with_a_corrected_payload_then_approve_then_redrive(people):
    letter = dead_charge(order_id=5, amount=0)
    response = people.requester.post(
        url(letter, "request-replay"),
        {"reason": "amount was lost in the import", "kwargs": {"order_id": 5, "amount": 700}},
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["replay_state"] == "requested" and body["replay_requested_by"] == "rita"
    assert body["replay_kwargs"] == {"order_id": 5, "amount": 700}
    assert body["replay_events"][0]["data"]["kwargs"] == {"order_id": 5, "amount": 700}

    # Approving a correction needs view_payload (amir lacks it) and the digest reviewed.
    reader = client_for(make_user("rhea", "approve_replay", "view_deadletter", "view_payload"))
    digest = reader.get(url(letter)).json()["correction_digest"]
    response = reader.post(
        url(letter, "approve"), {"reason": "matches the order", "correction_digest": digest}, format="json"
    )
    assert response.status_code == 200, response.content
    body = people.approver.get(url(letter)).json()
    assert body["replay_state"] == "approved" and body["replay_decided_by"] == "rhea"
    # amir lacks view_payload: neither the corrected payload nor the trail's copy shows.
    assert "replay_kwargs" not in body and "traceback" not in body
    assert [e["action"] for e in body["replay_events"]] == ["requested", "approved"]
    assert "kwargs" not in body["replay_events"][0]["data"]
    assert body["replay_events"][0]["actor"] == "rita" and body["replay_events"][0]["reason"]

    run_burst()
    (job,) = replay_jobs()
    assert job.kwargs == {"order_id": 5, "amount": 700} and job.status == "succeeded"
    detail = people.viewer.get(url(letter)).json()
    assert detail["replay_state"] == "replayed" and detail["replay_job_id"] == job.pk
    assert [e["action"] for e in detail["replay_events"]] == ["requested", "approved", "replayed"]


def test_the_requester_cannot_approve_their_own_replay(people):
    both = client_for(make_user("sam", "request_replay", "approve_replay", "view_deadletter"))
    letter = dead_charge(order_id=6, amount=0)
    assert both.post(url(letter, "request-replay"), {"reason": "retry it"}, format="json").status_code == 200
    before = state(letter)
    response = both.post(url(letter, "approve"), {"reason": "looks fine"}, format="json")
    assert response.status_code == 403
    assert "another user" in response.json()["detail"]
    assert state(letter) == before
    assert people.approver.post(url(letter, "approve"), {"reason": "ok"}, format="json").status_code == 200


@pytest.mark.parametrize(
    ("who", "action", "body"),
    [
        ("viewer", "request-replay", {"reason": "x"}),
        ("viewer", "approve", {"reason": "x"}),
        ("viewer", "reject", {"reason": "x"}),
        ("requester", "approve", {"reason": "x"}),
        ("blind", "request-replay", {"reason": "x", "args": [1]}),
        ("outsider", "request-replay", {"reason": "x"}),
    ],
)
def test_a_user_without_the_permission_gets_403_and_nothing_changes(people, who, action, body):
    letter = dead_charge(order_id=7, amount=0)
    if action != "request-replay":
        dlq.request_replay(letter, people.users.blind, "please")
    before = state(letter)
    response = getattr(people, who).post(url(letter, action), body, format="json")
    assert response.status_code == 403, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert state(letter) == before
    assert client_for(None).post(url(letter, action), body, format="json").status_code in (401, 403)
    assert state(letter) == before


def test_reject_needs_a_reason_and_records_it(people):
    letter = dead_charge(order_id=8, amount=0)
    dlq.request_replay(letter, people.users.requester, "please")
    before = state(letter)
    response = people.approver.post(url(letter, "reject"), {"reason": "  "}, format="json")
    assert response.status_code == 400 and "reason" in response.json()["errors"]
    assert state(letter) == before
    response = people.approver.post(
        url(letter, "reject"), {"reason": "the order was refunded"}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["replay_state"] == "rejected"
    assert response.json()["replay_events"][-1]["reason"] == "the order was refunded"


def test_a_step_from_the_wrong_state_is_409(people):
    letter = dead_charge(order_id=9, amount=0)
    before = state(letter)
    response = people.approver.post(url(letter, "approve"), {"reason": "ok"}, format="json")
    assert response.status_code == 409
    assert "its replay is none" in response.json()["detail"]
    assert state(letter) == before


def test_a_corrected_payload_that_does_not_bind_is_400_naming_the_parameter(people):
    letter = dead_charge(order_id=10, amount=0)
    before = state(letter)
    response = people.requester.post(
        url(letter, "request-replay"),
        {"reason": "fix", "kwargs": {"order_id": 10, "amunt": 5}},
        format="json",
    )
    assert response.status_code == 400
    assert "missing a required argument: 'amount'" in " ".join(response.json()["errors"]["kwargs"])
    assert state(letter) == before


def test_payloads_and_tracebacks_show_only_with_view_payload(people):
    letter = dead_charge(order_id=11, amount=0)
    for client, shown in ((people.viewer, False), (people.requester, True)):
        listed = client.get(f"{BASE}dead-letters/").json()["results"][0]
        detail = client.get(url(letter)).json()
        for body in (listed, detail):
            assert body["id"] == letter.pk and body["error_class"]
            assert ("args" in body, "kwargs" in body, "traceback" in body) == (shown, shown, shown)
        if shown:
            assert (
                detail["kwargs"] == {"order_id": 11, "amount": 0} and "PermanentError" in detail["traceback"]
            )
    assert people.viewer.get(url(letter)).json()["available_actions"] == []
    assert people.requester.get(url(letter)).json()["available_actions"] == ["request"]


def test_reading_dead_letters_without_view_deadletter_is_403(people):
    letter = dead_charge(order_id=12, amount=0)
    for path in (f"{BASE}dead-letters/", url(letter)):
        assert people.outsider.get(path).status_code == 403
        assert client_for(None).get(path).status_code in (401, 403)


def test_the_list_filters_and_costs_constant_queries(people):
    letters = [dead_charge(order_id=20 + n, amount=0) for n in range(4)]
    dlq.request_replay(letters[0], people.users.requester, "please")
    client = people.requester
    requested = client.get(f"{BASE}dead-letters/", {"replay_state": "requested"}).json()["results"]
    assert [row["id"] for row in requested] == [letters[0].pk]
    by_job = client.get(f"{BASE}dead-letters/", {"job": letters[1].job_id}).json()["results"]
    assert [row["id"] for row in by_job] == [letters[1].pk]
    counts = []
    for size in (1, 4):
        with CaptureQueriesContext(connection) as queries:
            assert len(client.get(f"{BASE}dead-letters/", {"page_size": size}).json()["results"]) == size
        counts.append(len(queries.captured_queries))
    assert counts[0] == counts[1], counts


def test_an_approval_with_a_stale_correction_digest_is_409_and_changes_nothing():
    letter = dead_charge(order_id=77, amount=0)
    requester = make_user("req77", "request_replay", "view_payload", "view_deadletter")
    dlq.request_replay(letter, requester, "fix", kwargs={"order_id": 77, "amount": 5})
    client = client_for(make_user("appr77", "approve_replay", "view_deadletter", "view_payload"))
    detail = client.get(f"{BASE}dead-letters/{letter.pk}/").json()
    reviewed = detail["correction_digest"]
    DeadLetter.objects.filter(pk=letter.pk).update(replay_kwargs={"order_id": 77, "amount": 500})
    url = f"{BASE}dead-letters/{letter.pk}/approve/"
    refused = client.post(url, {"reason": "ok", "correction_digest": reviewed}, format="json")
    assert refused.status_code == 409, refused.content
    assert refused.json()["code"] == "payload_changed"
    assert DeadLetter.objects.get(pk=letter.pk).replay_state == "requested"
    fresh = client.get(f"{BASE}dead-letters/{letter.pk}/").json()["correction_digest"]
    assert client.post(url, {"reason": "ok", "correction_digest": fresh}, format="json").status_code == 200


def test_an_approver_without_view_payload_cannot_approve_a_correction_over_the_api(people):
    letter = dead_charge(order_id=78, amount=0)
    dlq.request_replay(letter, people.users.requester, "cvv", kwargs={"order_id": 78, "amount": 777})
    detail = people.approver.get(url(letter)).json()
    assert detail["available_actions"] == ["reject"]
    before = state(letter)
    response = people.approver.post(
        url(letter, "approve"),
        {"reason": "ok", "correction_digest": detail["correction_digest"]},
        format="json",
    )
    assert response.status_code == 403, response.content
    assert "jobguard.view_payload" in response.json()["detail"]
    assert state(letter) == before


def test_approving_a_correction_over_the_api_needs_its_digest_and_an_original_does_not(people):
    reader = client_for(make_user("rhea", "approve_replay", "view_deadletter", "view_payload"))
    corrected, original = dead_charge(order_id=79, amount=0), dead_charge(order_id=80, amount=0)
    dlq.request_replay(corrected, people.users.requester, "fix", kwargs={"order_id": 79, "amount": 5})
    dlq.request_replay(original, people.users.requester, "retry")
    before = state(corrected)
    response = reader.post(url(corrected, "approve"), {"reason": "ok"}, format="json")
    assert response.status_code == 400, response.content
    assert "correction_digest" in response.json()["errors"]
    assert state(corrected) == before
    # A digest that is not the one shown (here not even ASCII) is stale: 409, not a 500.
    response = reader.post(
        url(corrected, "approve"), {"reason": "ok", "correction_digest": "é" * 32}, format="json"
    )
    assert response.status_code == 409 and response.json()["code"] == "payload_changed"
    assert state(corrected) == before
    assert reader.post(url(original, "approve"), {"reason": "ok"}, format="json").status_code == 200


def test_the_api_trail_hides_a_former_plain_digest_from_who_may_not_see_payloads(people):
    letter = dead_charge(order_id=81, amount=0)
    ReplayEvent.objects.create(
        dead_letter=letter,
        action="approved",
        actor_name="old",
        reason="before the upgrade",
        data={"payload_corrected": True, "correction_digest": "3f9c0e1a2b4d6f80"},
    )
    assert people.viewer.get(url(letter)).json()["replay_events"][0]["data"] == {"payload_corrected": True}
    shown = people.requester.get(url(letter)).json()  # rita may see payloads
    assert shown["replay_events"][0]["data"]["correction_digest"] == "3f9c0e1a2b4d6f80"
