"""The dead-letter and job admin through the test client: views, payload visibility, replay permissions."""

import datetime
import re
from types import SimpleNamespace

import pytest
from django.test import override_settings
from django.urls import reverse

from django_jobguard import dlq
from django_jobguard.models import DeadLetter, IdempotencyKey, Job, ReplayEvent
from tests.support.dlq import dead_charge, run_burst
from tests.support.factories import make_user
from tests.testapp import tasks_dlq

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:jobguard_deadletter_changelist"


@pytest.fixture
def people():
    return SimpleNamespace(
        requester=make_user("rita", "request_replay", "view_payload", "view_deadletter", "view_job"),
        approver=make_user("amir", "approve_replay", "view_deadletter", "view_job"),
        viewer=make_user("vic", "view_deadletter", "view_job"),
        blind=make_user("bob", "request_replay", "view_deadletter"),
    )


def page(letter):
    return reverse("admin:jobguard_deadletter_change", args=[letter.pk])


def replay_url(letter, action):
    return reverse("admin:jobguard_deadletter_replay", args=[letter.pk, action])


def state(letter):
    letter.refresh_from_db()
    return (
        letter.replay_state,
        letter.replay_kwargs,
        letter.replay_decided_by_id,
        ReplayEvent.objects.filter(dead_letter=letter).count(),
        Job.objects.count(),
    )


def test_the_list_filters_and_searches_dead_letters(client, people):
    dead_charge(order_id=1, amount=0)
    dead_charge(order_id=2, amount=402)  # CardDeclined, through fatal_on
    client.force_login(people.viewer)
    url = reverse(CHANGELIST)
    response = client.get(url)
    assert response.status_code == 200
    content = response.content.decode()
    for filter_title in (
        "By replay state",
        "By reason",
        "By category",
        "By queue",
        "By task",
        "By error class",
    ):
        assert filter_title.lower() in content.lower()
    declined = client.get(url, {"error_class": "tests.testapp.tasks_dlq.CardDeclined"})
    assert declined.context["cl"].result_count == 1
    assert client.get(url, {"q": "tests.testapp.tasks_dlq.CardDeclined"}).context["cl"].result_count == 1
    assert client.get(url, {"replay_state": "requested"}).context["cl"].result_count == 0
    assert (
        client.get(url, {"reason": "permanent_error", "queue_name": "default"}).context["cl"].result_count
        == 2
    )
    assert client.get(url, {"created_at__gte": "2000-01-01 00:00:00+00:00"}).context["cl"].result_count == 2


def test_the_payload_and_traceback_show_only_with_view_payload(client, people):
    letter = dead_charge(order_id=3, amount=0)
    client.force_login(people.requester)
    content = client.get(page(letter)).content.decode()
    assert "Payload and traceback" in content
    assert "Traceback (most recent call last)" in content
    assert "&quot;order_id&quot;: 3" in content
    assert "amount 0 is not a positive number of cents" in content

    client.force_login(people.viewer)
    content = client.get(page(letter)).content.decode()
    # The message echoes the payload (the amount): its class shows, the message does not.
    assert "PermanentError" in content
    assert "amount 0 is not a positive number of cents" not in content
    assert "Traceback (most recent call last)" not in content
    assert "&quot;order_id&quot;" not in content
    assert "Payload and traceback" not in content


def test_the_job_admin_shows_the_payload_only_with_view_payload(client, people):
    letter = dead_charge(order_id=4, amount=0)
    url = reverse("admin:jobguard_job_change", args=[letter.job_id])
    client.force_login(people.requester)
    content = client.get(url).content.decode()
    assert "&quot;amount&quot;: 0" in content
    assert f"dead letter #{letter.pk}" in content
    client.force_login(people.approver)
    content = client.get(url).content.decode()
    assert "&quot;amount&quot;" not in content
    assert f"dead letter #{letter.pk}" in content


def test_request_with_a_corrected_payload_then_approve_through_the_admin(client, people):
    letter = dead_charge(order_id=5, amount=0)
    client.force_login(people.requester)
    content = client.get(page(letter)).content.decode()
    assert replay_url(letter, "request") in content
    form = client.get(replay_url(letter, "request"))
    assert '"amount": 0' in form.context["form"]["kwargs"].value()

    response = client.post(
        replay_url(letter, "request"),
        {
            "reason": "amount was lost in the import",
            "args": "[]",
            "kwargs": '{"order_id": 5, "amount": 7070707}',
        },
    )
    assert response.status_code == 302
    assert state(letter)[:2] == ("requested", {"order_id": 5, "amount": 7070707})

    # amir may approve, but not read payloads: he may not approve a correction he cannot see.
    client.force_login(people.approver)
    content = client.get(page(letter)).content.decode()
    assert replay_url(letter, "approve") not in content and replay_url(letter, "reject") in content
    assert "jobguard.view_payload" in content  # the page says why approval is not offered

    reader = make_user("rhea", "approve_replay", "view_payload", "view_deadletter", "view_job")
    client.force_login(reader)
    approve_form = client.get(replay_url(letter, "approve"))
    content = approve_form.content.decode()
    assert "corrected" in content and "amount was lost in the import" in content and "7070707" in content
    digest = approve_form.context["correction_digest"]
    assert f'name="correction_digest" value="{digest}"' in content
    response = client.post(
        replay_url(letter, "approve"), {"reason": "matches the order", "correction_digest": digest}
    )
    assert response.status_code == 302
    letter.refresh_from_db()
    assert (letter.replay_state, letter.replay_decided_by) == ("approved", reader)

    client.force_login(people.approver)
    trail = client.get(page(letter)).content.decode()
    for text in ("Replay audit trail", "rita", "amount was lost in the import", "rhea", "matches the order"):
        assert text in trail
    assert "7070707" not in trail  # the corrected payload in the trail is hidden from amir
    client.force_login(people.requester)
    assert "7070707" in client.get(page(letter)).content.decode()


@pytest.mark.parametrize(
    ("who", "action", "setup"),
    [
        ("viewer", "request", None),  # no request_replay
        ("approver", "request", None),
        ("viewer", "approve", "requested"),  # no approve_replay
        ("requester", "approve", "requested"),  # rita requested it herself, and lacks the permission
        ("blind", "reject", "requested"),
    ],
)
def test_a_user_without_the_permission_gets_403_and_nothing_changes(client, people, who, action, setup):
    letter = dead_charge(order_id=6, amount=0)
    if setup == "requested":
        dlq.request_replay(letter, people.requester, "please")
    before = state(letter)
    client.force_login(getattr(people, who))
    assert client.get(replay_url(letter, action)).status_code == 403
    response = client.post(
        replay_url(letter, action), {"reason": "let me", "kwargs": '{"order_id": 6, "amount": 1}'}
    )
    assert response.status_code == 403
    assert state(letter) == before
    assert replay_url(letter, action) not in client.get(page(letter)).content.decode()


def test_self_approval_through_the_admin_is_403(client, people):
    both = make_user("sam", "request_replay", "approve_replay", "view_deadletter")
    letter = dead_charge(order_id=7, amount=0)
    dlq.request_replay(letter, both, "mine")
    before = state(letter)
    client.force_login(both)
    response = client.post(replay_url(letter, "approve"), {"reason": "trust me"})
    assert response.status_code == 403
    assert state(letter) == before


def test_a_payload_that_does_not_fit_is_shown_as_an_error_and_changes_nothing(client, people):
    letter = dead_charge(order_id=8, amount=0)
    before = state(letter)
    client.force_login(people.requester)
    response = client.post(
        replay_url(letter, "request"),
        {"reason": "fix", "args": "[]", "kwargs": '{"order_id": 8, "amout": 5}'},
    )
    assert response.status_code == 200
    assert "missing a required argument: &#x27;amount&#x27;" in response.content.decode()
    response = client.post(replay_url(letter, "request"), {"reason": "fix", "args": "[", "kwargs": "{}"})
    assert "Not valid JSON" in response.content.decode()
    response = client.post(replay_url(letter, "request"), {"reason": "fix", "args": "{}", "kwargs": "{}"})
    assert "Must be a JSON array." in response.content.decode()
    assert state(letter) == before


def test_a_wrong_state_is_explained_not_forbidden(client, people):
    letter = dead_charge(order_id=9, amount=0)
    dlq.request_replay(letter, people.requester, "first")
    client.force_login(people.requester)
    response = client.post(replay_url(letter, "request"), {"reason": "again", "args": "[]", "kwargs": "{}"})
    assert response.status_code == 409
    assert "its replay is requested" in response.content.decode()
    # Asking for the page shows the reason, not a form that could only fail.
    response = client.get(replay_url(letter, "request"))
    assert response.status_code == 409
    assert "its replay is requested" in response.content.decode()
    assert 'name="reason"' not in response.content.decode()


def test_approving_a_letter_nobody_asked_to_replay_shows_why_instead_of_a_form(client, people):
    letter = dead_charge(order_id=19, amount=0)
    client.force_login(people.approver)
    response = client.get(replay_url(letter, "approve"))
    assert response.status_code == 409
    page = response.content.decode()
    assert "its replay is none" in page or "allowed from requested" in page
    assert 'name="reason"' not in page


def test_a_corrected_value_of_the_wrong_type_is_refused_before_it_is_requested(client, people):
    letter = dead_charge(order_id=20, amount=0)
    before = state(letter)
    client.force_login(people.requester)
    response = client.post(
        replay_url(letter, "request"),
        {"reason": "fix", "args": "[]", "kwargs": '{"order_id": "twenty", "amount": 5}'},
    )
    assert response.status_code == 200
    assert "order_id=&#x27;twenty&#x27; is not int" in response.content.decode()
    assert state(letter) == before


def test_bulk_actions_ask_for_one_reason_then_apply_it_to_each_selected_letter(client, people):
    letters = [dead_charge(order_id=10 + i, amount=0) for i in range(3)]
    selected = [letter.pk for letter in letters]
    client.force_login(people.requester)
    url = reverse(CHANGELIST)
    confirm = client.post(url, {"action": "request_replays", "_selected_action": selected})
    assert confirm.status_code == 200
    assert "3 dead letters selected" in confirm.content.decode()
    client.post(
        url,
        {
            "action": "request_replays",
            "_selected_action": selected,
            "confirm": "yes",
            "reason": "after the outage",
        },
    )
    assert set(DeadLetter.objects.values_list("replay_state", flat=True)) == {"requested"}

    # rita may not approve: the action is not offered, and posting it changes nothing.
    assert "approve_replays" not in client.get(url).content.decode()
    client.post(
        url, {"action": "approve_replays", "_selected_action": selected, "confirm": "yes", "reason": "x"}
    )
    assert set(DeadLetter.objects.values_list("replay_state", flat=True)) == {"requested"}

    client.force_login(people.approver)
    client.post(
        url,
        {"action": "approve_replays", "_selected_action": selected[:2], "confirm": "yes", "reason": "fine"},
    )
    client.post(
        url, {"action": "reject_replays", "_selected_action": selected[2:], "confirm": "yes", "reason": "no"}
    )
    assert list(DeadLetter.objects.order_by("id").values_list("replay_state", flat=True)) == [
        "approved",
        "approved",
        "rejected",
    ]
    assert ReplayEvent.objects.filter(action="approved", actor=people.approver, reason="fine").count() == 2


def test_bulk_approval_skips_the_approvers_own_requests_and_says_why(client, people):
    both = make_user("sam", "request_replay", "approve_replay", "view_deadletter")
    mine, theirs = dead_charge(order_id=20, amount=0), dead_charge(order_id=21, amount=0)
    dlq.request_replay(mine, both, "mine")
    dlq.request_replay(theirs, people.requester, "theirs")
    client.force_login(both)
    response = client.post(
        reverse(CHANGELIST),
        {
            "action": "approve_replays",
            "_selected_action": [mine.pk, theirs.pk],
            "confirm": "yes",
            "reason": "ok",
        },
        follow=True,
    )
    messages = [str(m) for m in response.context["messages"]]
    assert any(f"#{mine.pk}: sam requested this replay" in m for m in messages), messages
    assert state(mine)[0] == "requested"
    assert state(theirs)[0] == "approved"


def test_a_refusal_is_an_admin_page_that_says_why(client, people):
    letter = dead_charge(order_id=30, amount=0)
    client.force_login(people.viewer)
    response = client.get(replay_url(letter, "request"))
    assert response.status_code == 403
    content = response.content.decode()
    assert "vic may not request replays: that needs the jobguard.request_replay permission." in content
    assert 'id="site-name"' in content  # the admin's own page (base_site), not a bare 403

    both = make_user("sam", "request_replay", "approve_replay", "view_deadletter")
    dlq.request_replay(letter, both, "mine")
    client.force_login(both)
    response = client.post(replay_url(letter, "approve"), {"reason": "trust me"})
    assert response.status_code == 403
    assert "sam requested this replay, so another user with jobguard.approve_replay must approve it" in (
        response.content.decode()
    )


def unknown_task_letter() -> DeadLetter:
    """A dead letter of a task no process registers any more (a worker met it and dead-lettered it)."""
    job = tasks_dlq.charge.enqueue(order_id=31, amount=5)
    Job.objects.filter(pk=job.pk).update(task_name="tests.testapp.tasks_dlq.removed")
    assert run_burst() == 0
    letter = DeadLetter.objects.get(job=job)
    assert letter.reason == "unknown_task"
    return letter


def test_request_replay_is_not_offered_where_it_can_only_fail_and_the_page_says_why(client, people):
    letter = unknown_task_letter()
    client.force_login(people.requester)
    content = client.get(page(letter)).content.decode()
    assert replay_url(letter, "request") not in content
    assert (
        "Request replay is not offered: Task &#x27;tests.testapp.tasks_dlq.removed&#x27; is not registered "
        "in this process"
    ) in content
    assert dlq.available_actions(letter, people.requester) == []

    client.force_login(people.approver)  # no request_replay: the page says so
    content = client.get(page(letter)).content.decode()
    assert "amir may not request replays: that needs the jobguard.request_replay permission." in content


def test_a_payload_that_no_longer_fits_is_offered_only_to_who_may_correct_it(client, people):
    job = tasks_dlq.charge.enqueue(order_id=32, amount=5)
    Job.objects.filter(pk=job.pk).update(kwargs={"order_id": 32, "amout": 5})
    assert run_burst() == 0
    letter = DeadLetter.objects.get(job=job)
    assert letter.reason == "invalid_payload"
    client.force_login(people.requester)  # may correct the payload
    assert replay_url(letter, "request") in client.get(page(letter)).content.decode()
    client.force_login(people.blind)  # may request, but only the original payload, which cannot run
    content = client.get(page(letter)).content.decode()
    assert replay_url(letter, "request") not in content
    assert "Request replay is not offered: Arguments do not fit" in content


CHICAGO_WINTER = datetime.datetime(2026, 12, 1, 6, 52, 3, tzinfo=datetime.UTC)
CHICAGO_SUMMER = datetime.datetime(2026, 7, 1, 6, 52, 3, tzinfo=datetime.UTC)


def test_times_show_seconds_and_their_zone_in_lists_detail_pages_and_the_audit_trail(client, people):
    letter = dead_charge(order_id=33, amount=0, key="charge:33")
    dlq.request_replay(letter, people.requester, "after the fix")
    Job.objects.filter(pk=letter.job_id).update(finished_at=CHICAGO_WINTER, started_at=CHICAGO_WINTER)
    DeadLetter.objects.filter(pk=letter.pk).update(last_failed_at=CHICAGO_SUMMER)
    ReplayEvent.objects.filter(dead_letter=letter).update(created_at=CHICAGO_WINTER)
    IdempotencyKey.objects.filter(key="charge:33").update(expires_at=CHICAGO_WINTER)
    key = IdempotencyKey.objects.get(key="charge:33")
    client.force_login(
        make_user("olga", "view_job", "view_deadletter", "view_idempotencykey", "view_payload")
    )
    pages = {
        "job list": reverse("admin:jobguard_job_changelist"),
        "job": reverse("admin:jobguard_job_change", args=[letter.job_id]),
        "dead letter list": reverse(CHANGELIST),
        "dead letter": page(letter),
        "key list": reverse("admin:jobguard_idempotencykey_changelist"),
        "key": reverse("admin:jobguard_idempotencykey_change", args=[key.pk]),
    }
    expected = {
        "job list": ["2026-12-01 00:52:03 CST (UTC-06:00)"],
        "job": ["2026-12-01 00:52:03 CST (UTC-06:00)"],
        "dead letter list": ["2026-07-01 01:52:03 CDT (UTC-05:00)"],
        "dead letter": ["2026-07-01 01:52:03 CDT (UTC-05:00)", "2026-12-01 00:52:03 CST (UTC-06:00)"],
        "key list": ["2026-12-01 00:52:03 CST (UTC-06:00)"],
        "key": ["2026-12-01 00:52:03 CST (UTC-06:00)"],
    }
    with override_settings(TIME_ZONE="America/Chicago"):
        for name, url in pages.items():
            content = client.get(url).content.decode()
            for text in expected[name]:
                assert text in content, (name, text)
            assert "a.m." not in content and "p.m." not in content, name
    # In UTC they read as jobguard_status prints its times.
    assert "2026-12-01 06:52:03 UTC" in client.get(pages["job list"]).content.decode()
    trail = client.get(pages["dead letter"]).content.decode()
    assert "2026-07-01 06:52:03 UTC" in trail and "2026-12-01 06:52:03 UTC" in trail


def test_the_approver_sees_original_against_corrected_payload_or_only_the_changed_argument_names(
    client, people
):
    letter = dead_charge(order_id=30, amount=0, key="charge:order:30")
    corrected = {"order_id": 31, "amount": 7070707}
    dlq.request_replay(letter, people.requester, "it was order 31", kwargs=corrected)
    reader = make_user("rhea", "approve_replay", "view_payload", "view_deadletter", "view_job")
    client.force_login(reader)
    for url in (replay_url(letter, "approve"), page(letter)):
        response = client.get(url)
        content = response.content.decode()
        assert "Payload correction" in content
        rows = [(r["name"], r["original"], r["corrected"]) for r in response.context["correction_rows"]]
        assert rows == [("order_id", "30", "31"), ("amount", "0", "7070707")]
        assert "<del><pre>30</pre></del>" in content and "<ins><pre>7070707</pre></ins>" in content
        assert "raises IdempotencyConflict" in content

    client.force_login(people.approver)  # may approve, may not read payloads
    content = client.get(page(letter)).content.decode()
    assert "Payload changed: order_id, amount." in content
    assert "raises IdempotencyConflict" in content  # the warning names arguments only
    assert "7070707" not in content and "<del>" not in content
    assert "charge:order:30" not in content  # the key is made of the arguments
    # Nor may he approve it: the approve page says why instead of a form.
    refused = client.get(replay_url(letter, "approve"))
    assert refused.status_code == 403 and "jobguard.view_payload" in refused.content.decode()
    assert "7070707" not in refused.content.decode()


def test_a_request_whose_correction_changes_the_keys_arguments_is_shown_with_its_warnings_first(
    client, people
):
    letter = dead_charge(order_id=32, amount=0, key="charge:order:32")
    before = state(letter)
    client.force_login(people.requester)
    corrected = {"reason": "it was order 33", "args": "[]", "kwargs": '{"order_id": 33, "amount": 700}'}
    response = client.post(replay_url(letter, "request"), corrected)
    assert response.status_code == 200
    content = response.content.decode()
    assert "changes order_id, amount, which the fingerprint of the job&#x27;s idempotency key" in content
    assert "submit again to request this replay" in content
    assert state(letter) == before  # nothing requested yet
    token = response.context["confirm_correction"]

    # A confirmation of another payload than the one reviewed is reviewed afresh.
    other = {**corrected, "kwargs": '{"order_id": 34, "amount": 700}', "confirm_correction": token}
    assert client.post(replay_url(letter, "request"), other).status_code == 200
    assert state(letter) == before

    response = client.post(replay_url(letter, "request"), {**corrected, "confirm_correction": token})
    assert response.status_code == 302
    assert state(letter)[:2] == ("requested", {"order_id": 33, "amount": 700})


def test_idempotency_key_now_describes_the_dead_letters_own_replay_as_its_replay(client, people):
    letter = dead_charge(order_id=35, amount=0, key="charge:order:35")
    client.force_login(people.viewer)
    expected = f"failed (job #{letter.job_id}, the dead job): a replay takes the key over"
    assert expected in client.get(page(letter)).content.decode()
    dlq.request_replay(letter, people.requester, "fix", kwargs={"order_id": 35, "amount": 500})
    dlq.approve_replay(letter, make_user("rhea", "approve_replay", "view_payload"), "ok")
    [job] = dlq.redrive()
    content = client.get(page(letter)).content.decode()
    assert f"in progress (job #{job.pk}, this dead letter&#x27;s replay)" in content
    run_burst()
    content = client.get(page(letter)).content.decode()
    assert f"succeeded (job #{job.pk}, this dead letter&#x27;s replay): the replay ran the action" in content
    assert "acked as a duplicate" not in content


def breadcrumbs(html):
    return html.split('<div class="breadcrumbs">', 1)[1].split("</div>", 1)[0]


def test_the_replay_pages_carry_the_models_breadcrumbs_and_the_form_styles(client, people):
    letter = dead_charge(order_id=8, amount=0)
    client.force_login(people.requester)
    response = client.get(replay_url(letter, "request"))
    html = response.content.decode()
    crumbs = breadcrumbs(html)
    # Home, the list, this dead letter, then the page's title, in that order.
    links = (reverse("admin:index"), reverse(CHANGELIST), page(letter))
    places = [crumbs.index(f'href="{link}"') for link in links]
    assert places == sorted(places)
    assert crumbs.rstrip().endswith(str(response.context["title"]))
    assert "admin/css/forms.css" in html and 'class="module aligned"' in html
    refused = client.post(replay_url(letter, "approve"), {"reason": "mine"})  # rita may not approve
    assert refused.status_code == 403
    assert f'href="{reverse(CHANGELIST)}"' in breadcrumbs(refused.content.decode())


def test_delete_and_change_pages_refused_say_why(client, people):
    letter = dead_charge(order_id=21, amount=0)
    client.force_login(people.approver)
    url = reverse("admin:jobguard_deadletter_delete", args=[letter.pk])
    response = client.get(url)
    assert response.status_code == 403
    assert "Dead letters are not deleted by hand" in response.content.decode()
    assert DeadLetter.objects.filter(pk=letter.pk).exists()
    outsider = make_user("olga", "view_job")
    client.force_login(outsider)
    response = client.get(reverse("admin:jobguard_deadletter_change", args=[letter.pk]))
    assert response.status_code == 403
    assert "needs the jobguard.view_deadletter permission" in response.content.decode()


def test_a_corrected_payload_with_a_key_given_twice_is_refused(client, people):
    letter = dead_charge(order_id=22, amount=0)
    before = state(letter)
    client.force_login(people.requester)
    response = client.post(
        replay_url(letter, "request"),
        {"reason": "fix", "args": "[]", "kwargs": '{"order_id": 22, "amount": 5, "amount": 0}'},
    )
    assert response.status_code == 200
    assert "The key &quot;amount&quot; appears twice" in response.content.decode()
    assert state(letter) == before


def test_an_approver_who_may_not_see_payloads_cannot_approve_a_correction_on_its_page(client, people):
    letter = dead_charge(order_id=50, amount=0)
    dlq.request_replay(letter, people.requester, "cvv", kwargs={"order_id": 50, "amount": 777})
    digest = dlq.correction_digest(DeadLetter.objects.get(pk=letter.pk))
    before = state(letter)
    client.force_login(people.approver)
    assert client.get(replay_url(letter, "approve")).status_code == 403
    # Posting the form anyway, digest and all, changes nothing.
    response = client.post(replay_url(letter, "approve"), {"reason": "trust me", "correction_digest": digest})
    assert response.status_code == 403
    assert "jobguard.view_payload" in response.content.decode()
    assert state(letter) == before


def test_an_approval_posted_without_the_pages_digest_is_refused_for_a_correction(client, people):
    letter = dead_charge(order_id=51, amount=0)
    dlq.request_replay(letter, people.requester, "fix", kwargs={"order_id": 51, "amount": 5})
    reader = make_user("rhea", "approve_replay", "view_payload", "view_deadletter", "view_job")
    before = state(letter)
    client.force_login(reader)
    response = client.post(replay_url(letter, "approve"), {"reason": "ok"})
    assert response.status_code == 200
    assert "correction_digest" in response.content.decode()
    assert state(letter) == before


def confirmation_digests(content: str) -> list[str]:
    import re

    return re.findall(r'name="reviewed" value="([^"]+)"', content)


def test_a_bulk_approval_is_bound_to_the_corrections_its_confirmation_page_showed(client, people):
    reader = make_user("rhea", "approve_replay", "view_payload", "view_deadletter", "view_job")
    letters = [dead_charge(order_id=60 + i, amount=0) for i in range(3)]
    for letter in letters[:2]:
        dlq.request_replay(letter, people.requester, "fix", kwargs={"order_id": letter.pk, "amount": 5})
    dlq.request_replay(letters[2], people.requester, "retry")
    selected = [letter.pk for letter in letters]
    client.force_login(reader)
    url = reverse(CHANGELIST)
    confirm = client.post(url, {"action": "approve_replays", "_selected_action": selected})
    reviewed = confirmation_digests(confirm.content.decode())
    assert sorted(int(entry.split(":")[0]) for entry in reviewed) == sorted(selected)
    # The requester swaps a correction after the approver read the page, before the submit.
    DeadLetter.objects.filter(pk=letters[1].pk).update(
        replay_kwargs={"order_id": letters[1].pk, "amount": 9999}
    )
    response = client.post(
        url,
        {
            "action": "approve_replays",
            "_selected_action": selected,
            "confirm": "yes",
            "reason": "as reviewed",
            "reviewed": reviewed,
        },
        follow=True,
    )
    messages = [str(m) for m in response.context["messages"]]
    assert any(f"#{letters[1].pk}'s replay payload changed since you reviewed it" in m for m in messages), (
        messages
    )
    assert [state(letter)[0] for letter in letters] == ["approved", "requested", "approved"]

    # A submit that does not carry the page's digests approves no correction (the original yes).
    letter = dead_charge(order_id=70, amount=0)
    dlq.request_replay(letter, people.requester, "fix", kwargs={"order_id": 70, "amount": 5})
    forged = client.post(
        url,
        {
            "action": "approve_replays",
            "_selected_action": [letter.pk, letters[1].pk],
            "confirm": "yes",
            "reason": "no review",
        },
        follow=True,
    )
    messages = [str(m) for m in forged.context["messages"]]
    assert any(
        f"#{letter.pk} replays a corrected payload" in m and "correction_digest" in m for m in messages
    )
    assert state(letter)[0] == state(letters[1])[0] == "requested"


def test_a_bulk_approval_of_corrections_is_refused_to_an_approver_who_may_not_see_them(client, people):
    corrected, original = dead_charge(order_id=71, amount=0), dead_charge(order_id=72, amount=0)
    dlq.request_replay(corrected, people.requester, "fix", kwargs={"order_id": 71, "amount": 5})
    dlq.request_replay(original, people.requester, "retry")
    selected = [corrected.pk, original.pk]
    client.force_login(people.approver)
    url = reverse(CHANGELIST)
    reviewed = confirmation_digests(
        client.post(url, {"action": "approve_replays", "_selected_action": selected}).content.decode()
    )
    # Submitted without leaving the corrections out: the admin refuses it all and says why.
    body = {"action": "approve_replays", "_selected_action": selected, "confirm": "yes", "reason": "go"}
    response = client.post(url, {**body, "reviewed": reviewed}, follow=True)
    assert any("jobguard.view_payload" in str(m) for m in response.context["messages"])
    assert state(corrected)[0] == state(original)[0] == "requested"
    # The service refuses it too, whichever form reaches it.
    decision = dlq.decide_many(
        dlq.APPROVE,
        selected,
        people.approver,
        "go",
        reviewed={int(pk): digest for pk, digest in (entry.split(":") for entry in reviewed)},
    )
    assert decision.moved == [original.pk] and "jobguard.view_payload" in dict(decision.refused)[corrected.pk]


def test_the_trail_hides_a_former_plain_digest_from_who_may_not_see_payloads(client, people):
    letter = dead_charge(order_id=73, amount=0)
    dlq.request_replay(letter, people.requester, "retry")
    ReplayEvent.objects.create(
        dead_letter=letter,
        action="approved",
        actor_name="old",
        reason="before the upgrade",
        data={"payload_corrected": True, "correction_digest": "3f9c0e1a2b4d6f80"},
    )
    client.force_login(people.approver)
    assert "3f9c0e1a2b4d6f80" not in client.get(page(letter)).content.decode()
    client.force_login(people.requester)
    assert "3f9c0e1a2b4d6f80" in client.get(page(letter)).content.decode()


def reason_field(html):
    return re.search(r"<textarea[^>]*name=\"reason\"[^>]*>", html).group(0)


def test_the_replay_forms_focus_the_reason_and_hide_the_empty_size_note(client, people):
    """A keyboard user lands in the reason (it took 97 Tab presses to reach it); no empty red box."""
    letters = [dead_charge(order_id=40 + i, amount=0) for i in range(2)]
    client.force_login(people.requester)
    html = client.get(replay_url(letters[0], "request")).content.decode()
    assert "autofocus" in reason_field(html) and html.count("autofocus") == 1
    # The size note is in the page, hidden until the script fills it; the admin's .errornote
    # (display: block) would show it as an empty red box without the [hidden] rule.
    assert '<p class="errornote" id="payload-too-big" hidden></p>' in html
    assert ".errornote[hidden] { display: none; }" in html
    for letter in letters:
        dlq.request_replay(letter, people.requester, "fixed")
    client.force_login(people.approver)
    html = client.get(replay_url(letters[0], "approve")).content.decode()
    assert "autofocus" in reason_field(html)
    selected = [letter.pk for letter in letters]
    bulk = client.post(reverse(CHANGELIST), {"action": "approve_replays", "_selected_action": selected})
    assert "autofocus" in reason_field(bulk.content.decode())
