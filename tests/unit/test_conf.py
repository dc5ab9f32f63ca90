import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_jobguard import conf


def test_defaults_apply_when_setting_is_absent():
    settings = conf.parse(None)
    assert settings.visibility_timeout == 60
    assert settings.max_attempts == 5
    assert (settings.retry.base, settings.retry.max, settings.retry.jitter) == (5, 300, 3)
    assert settings.locks.backend == "database"
    assert settings.locks.prefix == "jobguard:lock:"
    assert (settings.ack_window, settings.ack_batch_size) == (0.005, 100)


def test_queue_options_override_globals_and_fill_missing_keys():
    settings = conf.parse(
        {
            "VISIBILITY_TIMEOUT": 90,
            "QUEUES": {"exports": {"visibility_timeout": 3600, "retry": {"base": 30}}},
        }
    )
    exports = settings.queue("exports")
    assert exports.visibility_timeout == 3600
    assert exports.retry.base == 30
    assert exports.retry.max == 300  # from the global policy
    assert settings.queue("unlisted").visibility_timeout == 90


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"VISIBILITY_TIMOUT": 5}, "JOBGUARD['VISIBILITY_TIMOUT']"),
        (
            {"QUEUES": {"exports": {"visibility_timeout": -1}}},
            "JOBGUARD['QUEUES']['exports']['visibility_timeout']",
        ),
        ({"QUEUES": {"exports": {"visibilty": 1}}}, "JOBGUARD['QUEUES']['exports']['visibilty']"),
        ({"RETRY": {"base": "5"}}, "JOBGUARD['RETRY']['base']"),
        ({"RETRY": {"base": 10, "max": 1}}, "JOBGUARD['RETRY']['max']"),
        ({"LOCKS": {"BACKEND": "zookeeper"}}, "JOBGUARD['LOCKS']['BACKEND']"),
        ({"LOCKS": {"TTL": 0}}, "JOBGUARD['LOCKS']['TTL']"),
        ({"MAX_ATTEMPTS": 0}, "JOBGUARD['MAX_ATTEMPTS']"),
        ({"UNCLASSIFIED_ERRORS": "maybe"}, "JOBGUARD['UNCLASSIFIED_ERRORS']"),
        ({"REPLAY": {"RATE_PER_MINUTE": 0}}, "JOBGUARD['REPLAY']['RATE_PER_MINUTE']"),
        ({"API": {"MAX_PAYLOAD_BYTES": "big"}}, "JOBGUARD['API']['MAX_PAYLOAD_BYTES']"),
        ({"API": {"MAX_DEPTH": 0}}, "JOBGUARD['API']['MAX_DEPTH']"),
        ({"API": {"PAGE_SIZE": 100, "MAX_PAGE_SIZE": 10}}, "JOBGUARD['API']['MAX_PAGE_SIZE']"),
        ({"API": {"ENQUEUE_THROTTLE_RATE": "lots"}}, "JOBGUARD['API']['ENQUEUE_THROTTLE_RATE']"),
        ({"API": {"OPERATE_THROTTLE_RATE": "5/fortnight"}}, "JOBGUARD['API']['OPERATE_THROTTLE_RATE']"),
        ({"API": {"MAX_BODY": 1}}, "JOBGUARD['API']['MAX_BODY']"),
        ({"ACK_WINDOW": 5}, "JOBGUARD['ACK_WINDOW'] must be at most 1.0 seconds"),
        ({"ACK_WINDOW": -0.1}, "JOBGUARD['ACK_WINDOW']"),
        ({"ACK_BATCH_SIZE": 0}, "JOBGUARD['ACK_BATCH_SIZE']"),
        ({"REDACT": "card_number"}, "JOBGUARD['REDACT'] must be a list of argument names"),
        ({"REDACT": ["cvv", ""]}, "JOBGUARD['REDACT']"),
        ({"REDACT": [7]}, "JOBGUARD['REDACT']"),
        ({"OPENTELEMETRY_BAGGAGE": "tenant"}, "JOBGUARD['OPENTELEMETRY_BAGGAGE'] must be a list of baggage"),
        ({"OPENTELEMETRY_BAGGAGE": ["tenant", ""]}, "JOBGUARD['OPENTELEMETRY_BAGGAGE']"),
        ({"OPENTELEMETRY_BAGGAGE": ["a=b"]}, "JOBGUARD['OPENTELEMETRY_BAGGAGE'] holds 'a=b', not a baggage"),
        ({"OPENTELEMETRY_BAGGAGE": ["tenant id"]}, "holds 'tenant id', not a baggage entry name"),
        # Names and versions the database stores: refused when read, not by every claim after.
        (
            {"LIMITS": {"b" * 101: {"breaker": True}}},
            f"JOBGUARD['LIMITS']['{'b' * 101}'] is 101 characters long; it may have at most 100",
        ),
        (
            {"LIMITS": {"b" * 101: {"retry_budget": {"ratio": 0.1}}}},
            f"JOBGUARD['LIMITS']['{'b' * 101}'] is 101 characters long; it may have at most 100",
        ),
        (
            {"LIMITS": {"r" * 245: {"rate": "5/s"}}},
            f"JOBGUARD['LIMITS']['{'r' * 245}'] is 245 characters long; it may have at most 244: it is "
            "stored in the rate table's key column as 'rate:limit:<name>'",
        ),
        ({"LIMITS": {"stripe\x00": {"rate": "5/s"}}}, "JOBGUARD['LIMITS']['stripe\\x00'] holds a NUL"),
        (
            {"HANDLER_VERSION": "v" * 65},
            "JOBGUARD['HANDLER_VERSION'] is 65 characters long; it may have at most 64",
        ),
        ({"QUEUES": {"q" * 101: {}}}, f"JOBGUARD['QUEUES']['{'q' * 101}'] is 101 characters long"),
        (
            {"DEFAULT_QUEUE": "d" * 101},
            "JOBGUARD['DEFAULT_QUEUE'] is 101 characters long; it may have at most 100",
        ),
        ({"LOCKS": {"PREFIX": "p" * 255}}, "JOBGUARD['LOCKS']['PREFIX'] is 255 characters long"),
        *[
            (
                {"SCHEDULES": {"s": {"task": "t", "cron": "* * * * *", option: "x" * (width + 1)}}},
                f"JOBGUARD['SCHEDULES']['s']['{option}'] is {width + 1} characters long; "
                f"it may have at most {width}",
            )
            for option, width in (("task", 255), ("cron", 255), ("timezone", 64), ("queue_name", 100))
        ],
        (
            {"SCHEDULES": {"n" * 201: {"task": "t", "cron": "* * * * *"}}},
            f"JOBGUARD['SCHEDULES']['{'n' * 201}'] is 201 characters long; it may have at most 200",
        ),
    ],
)
def test_invalid_settings_name_the_key(raw, named):
    with pytest.raises(ImproperlyConfigured) as info:
        conf.parse(raw)
    assert named in str(info.value)


def test_stored_names_and_versions_are_accepted_up_to_their_columns():
    schedule = {"task": "t" * 255, "cron": "* * * * *", "timezone": "z" * 64, "queue_name": "q" * 100}
    settings = conf.parse(
        {
            "LIMITS": {
                "b" * 100: {"breaker": True, "retry_budget": True, "rate": "5/s"},
                "r" * 244: {"rate": "5/s"},
                # Neither a rate nor a breaker: the name is stored nowhere.
                "c" * 400: {"concurrency": 2},
            },
            "HANDLER_VERSION": "v" * 64,
            "QUEUES": {"q" * 100: {}},
            "DEFAULT_QUEUE": "d" * 100,
            "LOCKS": {"PREFIX": "p" * 254},
            "SCHEDULES": {"n" * 200: schedule},
        }
    )
    assert sorted(len(name) for name in settings.limits) == [100, 244, 400]
    assert (len(settings.handler_version), len(settings.default_queue)) == (64, 100)
    assert settings.schedules["n" * 200].queue_name == "q" * 100


def test_the_cached_settings_follow_override_settings():
    before = conf.get_settings().visibility_timeout
    with override_settings(JOBGUARD={"VISIBILITY_TIMEOUT": 1234}):
        assert conf.get_settings().visibility_timeout == 1234
    assert conf.get_settings().visibility_timeout == before


def test_system_check_reports_invalid_settings():
    from django_jobguard.checks.settings import check_settings

    with override_settings(JOBGUARD={"QUEUES": []}):
        messages = check_settings()
    assert [m.id for m in messages] == ["jobguard.E001"]
    assert "JOBGUARD['QUEUES']" in messages[0].msg


def test_the_api_settings_default_to_256_kib_and_accept_none_as_no_throttle():
    api = conf.parse({"API": {"ENQUEUE_THROTTLE_RATE": None, "OPERATE_THROTTLE_RATE": "10/s"}}).api
    assert (api.max_payload_bytes, api.max_depth, api.page_size, api.max_page_size) == (262144, 32, 50, 500)
    assert (api.enqueue_throttle_rate, api.operate_throttle_rate) == (None, "10/s")


def test_no_baggage_crosses_the_queue_unless_listed():
    assert conf.parse(None).opentelemetry_baggage == frozenset()
    assert conf.parse({"OPENTELEMETRY_BAGGAGE": ["tenant.id"]}).opentelemetry_baggage == {"tenant.id"}


def test_redact_names_are_matched_in_any_case():
    assert conf.parse(None).redact == frozenset()
    assert conf.parse({"REDACT": ["Card_Number", "cvv"]}).redact == {"card_number", "cvv"}
