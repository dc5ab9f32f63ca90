"""What the Celery projects tried in docs/how-to/move-from-celery.md ("Tried on real projects") needed.

cookiecutter-django's generated ``config/celery_app.py`` connects a receiver to Celery's
``setup_logging`` signal, and its settings set broker and result-backend options that mean
nothing without a broker.
"""

import logging

from django.core import checks
from django.test import override_settings

from django_jobguard.contrib.celery.checks import check_settings, check_signals
from django_jobguard.contrib.celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    setup_logging,
)


def test_a_receiver_of_a_logging_signal_imports_and_is_named_since_it_is_never_sent():
    def config_loggers(*args, **kwargs):
        logging.getLogger(__name__).info("never called")

    assert [m.id for m in check_signals()] == []
    setup_logging.connect(config_loggers)  # as cookiecutter-django's celery_app.py does
    after_setup_logger.connect()(config_loggers)  # as a decorator, with parentheses
    try:
        messages = [m for m in checks.run_checks() if m.id == "jobguard.celery.W006"]
    finally:
        setup_logging.disconnect(config_loggers)
        after_setup_logger.disconnect(config_loggers)
    assert sorted(m.msg.split("'s ")[1].split(" ")[0] for m in messages) == [
        "after_setup_logger",
        "setup_logging",
    ]
    assert all("LOGGING" in m.hint for m in messages)
    assert not after_setup_task_logger.has_listeners()
    assert [m.id for m in check_signals()] == []


def test_cookiecutter_djangos_broker_and_result_backend_settings_need_no_word():
    with override_settings(
        CELERY_BROKER_USE_SSL=None,
        CELERY_REDIS_BACKEND_USE_SSL=None,
        CELERY_RESULT_BACKEND_ALWAYS_RETRY=True,
        CELERY_RESULT_BACKEND_MAX_RETRIES=10,
        CELERY_TASK_CREATE_MISSING_QUEUES=False,
        CELERY_TASK_TIME_LIMIT=300,
    ):
        named = [m.msg for m in check_settings()]
    assert named == ["CELERY_TASK_TIME_LIMIT is not read by jobguard."]
