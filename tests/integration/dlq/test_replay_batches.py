"""Replays at the scale of an incident: batches, one correction for many, the corrected rows
first on the approval page, and the redrive rate changed from the console (issue 55, point 3-4)."""

import datetime
import re

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone

from django_jobguard import dlq
from django_jobguard.exceptions import ReplayError, ReplayPermissionDenied
from django_jobguard.models import DeadLetter, ReplayRateChange
from tests.support.factories import make_dead_letters, make_user

pytestmark = pytest.mark.django_db

URL = reverse("admin:jobguard_deadletter_changelist")
RATE = reverse("admin:jobguard_deadletter_redrive_rate")
CHARGE = "tests.testapp.tasks_dlq.charge"


def dead_letters(count, **fields):
    """Dead charges, each failed last a second after the one before: the list's order is theirs."""
    return make_dead_letters(count, spread_seconds=1, **fields)


def form_fields(page):
    """The confirmation form's fields as a browser would submit them (hidden inputs, ticked boxes)."""
    form = re.search(r'<form method="post" novalidate>(.*?)</form>', page, re.S).group(1)
    data: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form):
        data.setdefault(name, []).append(value)
    for name in re.findall(r'<input type="checkbox" name="([^"]+)" value="1" checked', form):
        data[name] = ["1"]
    return data


def select_all(client, action, url=URL, **fields):
    first = DeadLetter.objects.order_by("id").first()
    return client.post(
        url, {"action": action, "select_across": "1", "_selected_action": [first.pk], **fields}
    )


# -- the redrive rate ---------------------------------------------------------------------------


def approve_all():
    DeadLetter.objects.update(replay_state="approved", replay_decided_at=timezone.now())


def test_the_redrive_rate_set_in_the_console_is_the_throttle_of_the_next_pass(client):
    dead_letters(150)
    approve_all()
    client.force_login(make_user("approver", "view_deadletter", "approve_replay"))
    page = client.get(RATE).content.decode()
    assert "at most <strong>60</strong>" in page and "RATE_PER_MINUTE" in page
    response = client.post(
        RATE, {"rate_per_minute": "600", "reason": "incident 7: provider is back"}, follow=True
    )
    assert "Redrive rate set to 600/min" in response.content.decode()
    change = ReplayRateChange.objects.get()
    assert (change.rate_per_minute, change.actor_name, change.reason) == (
        600,
        "approver",
        "incident 7: provider is back",
    )
    entry = LogEntry.objects.get(content_type__model="replayratechange")
    assert "Redrive rate set to 600/min: incident 7" in entry.change_message
    assert dlq.current_rate().rate_per_minute == 600
    # 600 a minute allows a sixth, 100, in a burst: the setting's 60 would allow 10.
    assert len(dlq.redrive_once().jobs) == 100
    assert dlq.redrive_estimate(60).rate_per_minute == 600
    # The list links to the page, with the rate in force.
    assert "Redrive rate: 600 a minute" in client.get(URL).content.decode()
    # Empty: back to the setting, recorded too.
    client.post(RATE, {"rate_per_minute": "", "reason": "incident over"})
    assert dlq.current_rate().rate_per_minute == 60 and not dlq.current_rate().overridden
    assert ReplayRateChange.objects.count() == 2
    assert "the setting" in client.get(RATE).content.decode()


def test_changing_the_redrive_rate_needs_approve_replay_and_a_valid_rate(client):
    client.force_login(make_user("viewer", "view_deadletter", "request_replay"))
    page = client.get(RATE).content.decode()
    assert 'id="rate-form"' not in page and "needs the jobguard.approve_replay permission" in page
    refused = client.post(RATE, {"rate_per_minute": "600", "reason": "faster"})
    assert refused.status_code == 403 and "jobguard.approve_replay" in refused.content.decode()
    client.force_login(make_user("approver", "view_deadletter", "approve_replay"))
    for bad in ("0", "-5", "60001", "fast", "1.5"):
        page = client.post(RATE, {"rate_per_minute": bad, "reason": "x"})
        assert page.status_code == 200 and 'class="errorlist' in page.content.decode(), bad
    assert client.post(RATE, {"rate_per_minute": "100", "reason": "  "}).status_code == 200
    assert not ReplayRateChange.objects.exists()
    with pytest.raises(ReplayError, match="from 1 to 60,000"):
        dlq.set_rate(make_user("approver2", "approve_replay"), 0, "why")
    with pytest.raises(ReplayPermissionDenied):
        dlq.set_rate(make_user("requester", "request_replay"), 10, "why")


# -- the corrected rows first -------------------------------------------------------------------


def test_a_bulk_approval_of_thousands_lists_the_corrected_replays_first_with_their_path_diffs(client):
    letters = dead_letters(1_200)
    DeadLetter.objects.update(replay_state="requested", replay_requested_at=timezone.now())
    corrected = letters[-3:]  # the newest: never among the first 50 by id
    for n, letter in enumerate(corrected):
        DeadLetter.objects.filter(pk=letter.pk).update(
            replay_args=[], replay_kwargs={"order_id": letter.kwargs["order_id"], "amount": 500 + n}
        )
    client.force_login(make_user("approver", "view_deadletter", "approve_replay", "view_payload"))
    page = select_all(client, "approve_replays").content.decode()
    assert "3 of these replays run corrected payloads" in page and "listed first" in page
    listed = re.findall(r'<li class="corrected-letter" data-id="(\d+)"', page)
    assert listed == [str(letter.pk) for letter in corrected]
    diffs = re.findall(
        r'<tr class="correction-change"><td>(\w+)</td><td><del><pre>(\d+)</pre></del></td>'
        r"<td><ins><pre>(\d+)</pre></ins></td>",
        page,
    )
    assert diffs == [("amount", "0", "500"), ("amount", "0", "501"), ("amount", "0", "502")]
    data = form_fields(page)
    data["reason"] = ["checked the three corrections"]
    done = client.post(URL, data, follow=True).content.decode()
    assert "Approve replay: 1200 done." in done
    assert DeadLetter.objects.filter(replay_state="approved").count() == 1_200


def test_an_approver_without_view_payload_reads_which_arguments_changed_and_is_refused(client):
    letters = dead_letters(3)
    DeadLetter.objects.update(replay_state="requested")
    DeadLetter.objects.filter(pk=letters[0].pk).update(
        replay_args=[], replay_kwargs={"order_id": 0, "amount": 9}
    )
    client.force_login(make_user("approver", "view_deadletter", "approve_replay"))
    page = select_all(client, "approve_replays").content.decode()
    assert f'data-id="{letters[0].pk}"' in page and ": amount" in page
    assert "correction-change" not in page  # no values


# -- batches --------------------------------------------------------------------------------------


def test_a_batch_is_the_first_n_of_the_filter_by_last_failure_counted_before_it_is_requested(client):
    letters = dead_letters(300)
    client.force_login(make_user("requester", "view_deadletter", "request_replay"))
    page = select_all(client, "request_replays").content.decode()
    data = form_fields(page)
    data.update({"batch-first": ["40"], "preview": ["Update the counts"], "reason": ["wave 1"]})
    preview = client.post(URL, data).content.decode()
    assert "40 dead letters selected." in preview and "A batch of the 300 matching the filter." in preview
    assert not DeadLetter.objects.exclude(replay_state="none").exists()  # only counted
    confirm = form_fields(preview)
    confirm["batch-first"] = ["40"]
    confirm["reason"] = ["wave 1"]
    done = client.post(URL, confirm, follow=True).content.decode()
    assert "Request replay: 40 done." in done
    requested = set(DeadLetter.objects.filter(replay_state="requested").values_list("pk", flat=True))
    assert requested == {letter.pk for letter in letters[:40]}  # the oldest failures
    entry = LogEntry.objects.latest("id")
    assert "batch first 40" in entry.change_message


def test_a_batch_by_last_failure_range_and_a_bad_range_is_refused(client):
    base = timezone.now().replace(microsecond=0) - datetime.timedelta(hours=2)
    dead_letters(100, failed_at=base)  # last failed base+0s .. base+99s
    client.force_login(make_user("requester", "view_deadletter", "request_replay"))
    start = (base + datetime.timedelta(seconds=10)).astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    end = (base + datetime.timedelta(seconds=30)).astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    data = form_fields(select_all(client, "request_replays").content.decode())
    data.update({"batch-failed_from": [start], "batch-failed_to": [end], "reason": ["the 10-30 s wave"]})
    assert "Request replay: 20 done." in client.post(URL, data, follow=True).content.decode()
    assert DeadLetter.objects.filter(replay_state="requested").count() == 20
    data.update({"batch-failed_from": [end], "batch-failed_to": [start]})
    page = client.post(URL, data).content.decode()
    assert "must be before" in page
    assert DeadLetter.objects.filter(replay_state="requested").count() == 20


# -- one correction for a selection --------------------------------------------------------------


PATCH = '[{"op": "replace", "path": "/kwargs/amount", "value": 500}]'


def test_one_json_patch_corrects_each_selected_letter_and_each_is_approved_with_its_diff(client):
    letters = dead_letters(40)
    odd = letters[5]
    DeadLetter.objects.filter(pk=odd.pk).update(kwargs={"order_id": 5})  # no amount to replace
    client.force_login(make_user("requester", "view_deadletter", "request_replay", "view_payload"))
    data = form_fields(select_all(client, "request_replays").content.decode())
    data.update({"patch": [PATCH], "reason": ["provider sent amounts in euros"]})
    done = client.post(URL, data, follow=True).content.decode()
    assert "Request replay: 39 done with the correction, 1 not changed." in done
    assert (
        f"#{odd.pk}: Dead letter #{odd.pk}: /kwargs/amount: there is no &#x27;amount&#x27; to replace" in done
    )
    requested = DeadLetter.objects.filter(replay_state="requested")
    assert requested.count() == 39
    assert all(letter.replay_kwargs == {**letter.kwargs, "amount": 500} for letter in requested)
    patch_logged = '(correction [{"op": "replace", "path": "/kwargs/amount", "value": 500}])'
    assert patch_logged in LogEntry.objects.latest("id").change_message

    client.force_login(make_user("approver", "view_deadletter", "approve_replay", "view_payload"))
    requested_url = URL + "?replay_state__exact=requested"
    page = select_all(client, "approve_replays", url=requested_url).content.decode()
    assert page.count('class="corrected-letter"') == 39
    assert (
        page.count("<td>amount</td><td><del><pre>0</pre></del></td><td><ins><pre>500</pre></ins></td>") == 39
    )
    data = form_fields(page)
    data["reason"] = ["500 is right"]
    assert "Approve replay: 39 done." in client.post(requested_url, data, follow=True).content.decode()
    assert DeadLetter.objects.filter(replay_state="approved").count() == 39


def test_a_bad_patch_is_refused_before_anything_and_a_requester_without_view_payload_cannot_send_one(client):
    dead_letters(3)
    client.force_login(make_user("requester", "view_deadletter", "request_replay", "view_payload"))
    data = form_fields(select_all(client, "request_replays").content.decode())
    for bad, said in [
        ("{}", "JSON array of operations"),
        ('[{"op": "move", "path": "/kwargs/amount"}]', "op must be one of"),
        ('[{"op": "replace", "path": "/args/0", "value": 1}]', "inside the kwargs"),
        ('[{"op": "add", "path": "/kwargs/x"}]', "add needs a value"),
        ("[", "not valid JSON"),
    ]:
        page = client.post(URL, {**data, "patch": [bad], "reason": ["r"]}).content.decode()
        assert said in page, bad
    assert not DeadLetter.objects.exclude(replay_state="none").exists()
    client.force_login(make_user("blind", "view_deadletter", "request_replay"))
    data = form_fields(select_all(client, "request_replays").content.decode())
    assert 'name="patch"' not in select_all(client, "request_replays").content.decode()
    refused = client.post(URL, {**data, "patch": [PATCH], "reason": ["r"]})
    assert refused.status_code == 403 and "jobguard.view_payload" in refused.content.decode()
    assert not DeadLetter.objects.exclude(replay_state="none").exists()


def test_a_patch_that_breaks_the_handlers_signature_is_refused_per_letter():
    letters = dead_letters(2)
    user = make_user("requester", "request_replay", "view_payload")
    decision = dlq.request_many_corrected(
        [letter.pk for letter in letters],
        user,
        "r",
        dlq.parse_patch('[{"op": "add", "path": "/kwargs/nope", "value": 1}]'),
    )
    assert decision.moved == [] and len(decision.refused) == 2
    assert "nope" in decision.refused[0][1]


# -- lookup by a business value --------------------------------------------------------------------


def test_a_key_prefix_search_finds_the_incidents_letters_for_users_who_may_see_payloads(client):
    letters = dead_letters(4)
    keys = ["order-50012:charge", "order-50012:refund", "order-5001:charge", "Order-50012:charge"]
    for letter, key in zip(letters, keys, strict=True):
        DeadLetter.objects.filter(pk=letter.pk).update(idempotency_key=key)
    client.force_login(make_user("reader", "view_deadletter", "view_payload"))

    def found(term):
        page = client.get(URL, {"q": term}).content.decode()
        return {int(pk) for pk in re.findall(r'href="/admin/jobguard/deadletter/(\d+)/change/', page)}

    assert found("order-50012*") == {letters[0].pk, letters[1].pk}  # exact case, a true prefix
    assert found('"order-5001*"') == {letters[0].pk, letters[1].pk, letters[2].pk}
    assert found("order-50012* order-5001:charge") == {letters[0].pk, letters[1].pk, letters[2].pk}
    assert found("order-50012:refund") == {letters[1].pk}  # whole values as before
    assert found("or*") == set()  # too short to be a prefix: a whole value that matches nothing
    assert found("order_50012*") == set()  # _ and % are no wildcards
    client.force_login(make_user("blind", "view_deadletter"))
    assert found("order-50012*") == set()  # the key carries argument values


def test_the_key_prefix_lookup_reads_an_index():
    from django.db import connection

    from django_jobguard.admin.dead_letters import key_prefix

    query = DeadLetter.objects.filter(key_prefix("order-500")).values_list("pk")
    sql, params = query.query.sql_with_params()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("EXPLAIN " + sql, params)
            assert "jobguard_dl_idem_like_idx" in " ".join(row[0] for row in cursor.fetchall())
        elif connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            assert "jobguard_dl_idem_idx" in " ".join(str(row) for row in cursor.fetchall())
        else:
            cursor.execute("EXPLAIN " + sql, params)
            assert "jobguard_dl_idem_idx" in " ".join(str(row) for row in cursor.fetchall())
