"""``JOBGUARD["RETENTION"]`` and a queue's ``retention``: defaults, merging, the errors and jobguard.W065."""

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_jobguard import conf
from django_jobguard.checks.settings import check_retention


def test_the_defaults_keep_succeeded_jobs_a_day_and_the_others_a_week():
    settings = conf.parse(None)
    policy = settings.retention.policy
    assert (policy.succeeded, policy.cancelled, policy.dead) == (86400.0, 604800.0, 604800.0)
    assert (settings.retention.interval, settings.retention.batch_size) == (60.0, 500)
    assert settings.retention_for("anything") == policy


def test_a_queue_retention_takes_the_keys_it_leaves_out_from_the_global_one():
    settings = conf.parse(
        {
            "RETENTION": {"SUCCEEDED": 3600, "DEAD": None},
            "QUEUES": {"emails": {"retention": {"succeeded": 60}}, "plain": {}},
        }
    )
    emails = settings.retention_for("emails")
    assert (emails.succeeded, emails.cancelled, emails.dead) == (60.0, 604800.0, None)
    assert settings.retention_for("plain") == settings.retention.policy
    assert settings.retention.policy.succeeded == 3600.0
    assert settings.queue("emails").retention == emails


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"RETENTION": {"SUCCEEDED": -1}}, "JOBGUARD['RETENTION']['SUCCEEDED'] must be at least 0, not -1."),
        (
            {"RETENTION": {"DEAD": "7d"}},
            "JOBGUARD['RETENTION']['DEAD'] must be a number of seconds, or None to keep these jobs, "
            "not '7d'.",
        ),
        ({"RETENTION": {"KEEP": 1}}, "JOBGUARD['RETENTION']['KEEP'] is not a known setting"),
        ({"RETENTION": {"INTERVAL": -5}}, "JOBGUARD['RETENTION']['INTERVAL'] must be at least 0"),
        (
            {"RETENTION": {"BATCH_SIZE": 0}},
            "JOBGUARD['RETENTION']['BATCH_SIZE'] must be an integer of at least 1",
        ),
        (
            {"QUEUES": {"emails": {"retention": {"succeeded": True}}}},
            "JOBGUARD['QUEUES']['emails']['retention']['succeeded'] must be a number of seconds",
        ),
        (
            {"QUEUES": {"emails": {"retention": {"running": 60}}}},
            "JOBGUARD['QUEUES']['emails']['retention']['running'] is not a known setting; known keys "
            "here: cancelled, dead, succeeded.",
        ),
        (
            {"QUEUES": {"emails": {"retention": 60}}},
            "JOBGUARD['QUEUES']['emails']['retention'] must be a dict, not int.",
        ),
    ],
)
def test_a_bad_retention_is_refused_naming_the_key(raw, message):
    with pytest.raises(ImproperlyConfigured) as caught:
        conf.parse(raw)
    assert str(caught.value).startswith(message)


def test_w065_warns_of_succeeded_jobs_kept_less_than_the_tuning_window():
    with override_settings(
        JOBGUARD={
            "TUNING": {"WINDOW": 7200},
            "RETENTION": {"SUCCEEDED": 3600},
            "QUEUES": {
                "emails": {"retention": {"succeeded": 600}},
                "slow": {"retention": {"succeeded": 7200}},
            },
        }
    ):
        messages = check_retention()
    assert [m.id for m in messages] == ["jobguard.W065", "jobguard.W065"]
    assert messages[0].msg.startswith(
        "JOBGUARD['RETENTION']['SUCCEEDED'] keeps succeeded jobs 3600s, less than "
        "JOBGUARD['TUNING']['WINDOW'] (7200s)"
    )
    assert messages[1].msg.startswith("JOBGUARD['QUEUES']['emails']['retention']['succeeded'] keeps")
    assert "TUNING['WINDOW']" in messages[0].hint
    with override_settings(JOBGUARD={}):
        assert check_retention() == [], "the defaults keep succeeded jobs exactly the window"
    with override_settings(JOBGUARD={"RETENTION": {"SUCCEEDED": None}}):
        assert check_retention() == []
