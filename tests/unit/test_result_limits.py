"""The result size limit's options, checked where they are written (the limit at work:
tests/integration/worker/test_result_limits.py)."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_jobguard import conf
from django_jobguard.exceptions import InvalidTaskError
from django_jobguard.task import Task
from tests.testapp import tasks


def test_the_result_limit_defaults_to_one_mebibyte_and_refuses_a_bad_value_naming_the_key():
    assert conf.parse(None).max_result_bytes == 1024 * 1024
    assert conf.parse({"MAX_RESULT_BYTES": 10}).max_result_bytes == 10
    for bad in (0, "1MB", 1.5):
        with pytest.raises(ImproperlyConfigured, match=r"JOBGUARD\['MAX_RESULT_BYTES'\]"):
            conf.parse({"MAX_RESULT_BYTES": bad})


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1MB"])
def test_a_task_s_result_limit_must_be_a_positive_whole_number(bad):
    with pytest.raises(InvalidTaskError, match=r"max_result_bytes must be a whole number of bytes"):
        Task(func=tasks.add.func, name="tests.unit.bad_limit", max_result_bytes=bad)
