"""Bulk replay of more dead letters than a request may carry fields: "select all" is a filter."""

import re

import pytest
from django.urls import reverse

from django_jobguard.models import DeadLetter
from tests.support.factories import make_dead_letters, make_user

pytestmark = pytest.mark.django_db

URL = reverse("admin:jobguard_deadletter_changelist")
#: More than Django's DATA_UPLOAD_MAX_NUMBER_FIELDS (1,000): one field per row cannot work.
COUNT = 1_200


def post_back(client, page):
    """Submit the confirmation page's form as a browser would: every field it carries."""
    form = re.search(r'<form method="post" novalidate>(.*?)</form>', page, re.S).group(1)
    data: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form):
        data.setdefault(name, []).append(value)
    for name in re.findall(r'<input type="checkbox" name="([^"]+)" value="1" checked', form):
        data[name] = ["1"]
    data["reason"] = ["provider fixed"]
    return client.post(URL, data)


def test_select_all_of_1200_dead_letters_requests_every_replay(client):
    make_dead_letters(COUNT)
    client.force_login(make_user("requester", "view_deadletter", "request_replay"))
    first = DeadLetter.objects.order_by("id").first()
    page = client.post(
        URL, {"action": "request_replays", "select_across": "1", "_selected_action": [first.pk]}
    )
    html = page.content.decode()
    assert page.status_code == 200
    assert "1200 dead letters selected" in html
    assert "The list below shows the first 50; the action applies to all of them." in html
    done = post_back(client, html)
    assert done.status_code == 302, done.content[:500]
    assert DeadLetter.objects.filter(replay_state="requested").count() == COUNT


def test_bulk_approval_flags_corrected_payloads_and_refuses_them_to_those_who_cannot_see_them(client):
    make_dead_letters(3, replay_state="requested")
    corrected = DeadLetter.objects.order_by("id").first()
    DeadLetter.objects.filter(pk=corrected.pk).update(replay_kwargs={"order_id": 0, "amount": 5})
    ids = list(DeadLetter.objects.values_list("pk", flat=True))
    client.force_login(make_user("approver", "view_deadletter", "approve_replay"))
    html = client.post(URL, {"action": "approve_replays", "_selected_action": ids}).content.decode()
    assert "1 of these replays runs a corrected payload" in html
    assert "Replays run their original payloads" not in html
    assert "second person" not in html  # this page is the second person's approval
    assert 'class="corrected"' in html
    # Without view_payload the corrected one is left out (the box comes checked).
    assert post_back(client, html).status_code == 302
    states = dict(DeadLetter.objects.values_list("pk", "replay_state"))
    assert states.pop(corrected.pk) == "requested"
    assert set(states.values()) == {"approved"}
